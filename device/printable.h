/* mloop — names as people see them: an image's name is chosen by
 * whoever attached it (a user, through mloop's D-Bus service) and is
 * shown to others, on root's terminal and in the journal.  A control
 * character there could move the cursor, rewrite a line or fake
 * another, so none is shown raw; nor is an invisible character that
 * reorders or hides what is shown (RLO before "gmi.toor" reads
 * "root.img"), nor a line or paragraph separator.
 */
#ifndef MLOOP_PRINTABLE_H
#define MLOOP_PRINTABLE_H

#include <stdbool.h>

#include <glib.h>

/* Whether C is shown as nothing yet changes how what is around it is
 * shown, or hides text: every format character (Unicode's category Cf:
 * the bidi controls U+061C, U+200E, U+200F, U+202A to U+202E and U+2066
 * to U+2069, the zero-width characters U+200B to U+200D and U+FEFF, the
 * invisible operators U+2060 to U+2064, the soft hyphen, the deprecated
 * shaping controls U+206A to U+206F, the tag characters U+E0001 and
 * U+E0020 to U+E007F, which spell a text no one sees), and the line and
 * paragraph separators U+2028 and U+2029, at which a viewer may start
 * what looks like another line.
 */
bool mloop_is_invisible_format (gunichar c);

/* TEXT with every byte that is a control character (C0, DEL, or a C1
 * code point such as U+009B, which terminals read as CSI), part of an
 * invisible format character (mloop_is_invisible_format), or not part
 * of valid UTF-8, written as \xHH, and a backslash as \\; printable
 * UTF-8 is kept as it is.  NULL for NULL; g_free it.
 */
char *mloop_printable (const char *text);

/* TEXT as mloop_printable shows it, but at most MAX bytes of it (never
 * half an escape or a character), then, when cut, "... (N bytes)"
 * with TEXT's length: for a log, where one call's name of 4,095 control
 * characters would be 16 KB a line.  NULL for NULL; g_free it.
 */
char *mloop_printable_short (const char *text, size_t max);

#endif /* MLOOP_PRINTABLE_H */
