/* mloop — names as people see them: an image's name is chosen by
 * whoever attached it (a user, through mloop's D-Bus service) and is
 * shown to others, on root's terminal and in the journal.  A control
 * character there could move the cursor, rewrite a line or fake
 * another, so none is shown raw.
 */
#ifndef MLOOP_PRINTABLE_H
#define MLOOP_PRINTABLE_H

/* TEXT with every byte that is a control character (C0, DEL, or a C1
 * code point such as U+009B, which terminals read as CSI), or not part
 * of valid UTF-8, written as \xHH, and a backslash as \\; printable
 * UTF-8 is kept as it is.  NULL for NULL; g_free it.
 */
char *mloop_printable (const char *text);

#endif /* MLOOP_PRINTABLE_H */
