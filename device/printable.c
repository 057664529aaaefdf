/* mloop — names as people see them (printable.h). */
#include <string.h>

#include <glib.h>

#include "printable.h"

static void
append_escaped (GString *out, const char *from, const char *to)
{
  for (const char *b = from; b < to; b++)
    g_string_append_printf (out, "\\x%02x", (unsigned char) *b);
}

char *
mloop_printable (const char *text)
{
  GString *out;

  if (text == NULL)
    return NULL;
  out = g_string_sized_new (strlen (text));
  for (const char *p = text; *p; ) {
    gunichar c = g_utf8_get_char_validated (p, -1);

    if (c == (gunichar) -1 || c == (gunichar) -2) {
      /* Not UTF-8: one byte at a time, so the rest may still be. */
      append_escaped (out, p, p + 1);
      p++;
      continue;
    }
    const char *next = g_utf8_next_char (p);

    if (c < 0x20 || (c >= 0x7f && c <= 0x9f))
      append_escaped (out, p, next);
    else if (c == '\\')
      g_string_append (out, "\\\\");
    else
      g_string_append_len (out, p, next - p);
    p = next;
  }
  return g_string_free (out, FALSE);
}
