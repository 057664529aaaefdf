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

bool
mloop_is_invisible_format (gunichar c)
{
  switch (g_unichar_type (c)) {
  case G_UNICODE_FORMAT:
  case G_UNICODE_LINE_SEPARATOR:
  case G_UNICODE_PARAGRAPH_SEPARATOR:
    return true;
  default:
    /* Named too, whatever the Unicode tables GLib has. */
    return c == 0x061c || (c >= 0x200b && c <= 0x200f) ||
      (c >= 0x202a && c <= 0x202e) || (c >= 0x2060 && c <= 0x2064) ||
      (c >= 0x2066 && c <= 0x2069) || c == 0xfeff;
  }
}

/* TEXT escaped as mloop_printable says, stopping before the escape or
 * character that would take it past MAX bytes (0: no limit); *CUT says
 * whether it stopped.
 */
static GString *
escape (const char *text, size_t max, bool *cut)
{
  GString *out = g_string_sized_new (max ? max : strlen (text));

  *cut = false;
  for (const char *p = text; *p; ) {
    gunichar c = g_utf8_get_char_validated (p, -1);
    const char *next;
    size_t had = out->len;

    if (c == (gunichar) -1 || c == (gunichar) -2) {
      /* Not UTF-8: one byte at a time, so the rest may still be. */
      next = p + 1;
      append_escaped (out, p, next);
    }
    else {
      next = g_utf8_next_char (p);
      if (c < 0x20 || (c >= 0x7f && c <= 0x9f) ||
          mloop_is_invisible_format (c))
        append_escaped (out, p, next);
      else if (c == '\\')
        g_string_append (out, "\\\\");
      else
        g_string_append_len (out, p, next - p);
    }
    if (max && out->len > max) {
      g_string_truncate (out, had);
      *cut = true;
      break;
    }
    p = next;
  }
  return out;
}

char *
mloop_printable (const char *text)
{
  bool cut;

  if (text == NULL)
    return NULL;
  return g_string_free (escape (text, 0, &cut), FALSE);
}

char *
mloop_printable_short (const char *text, size_t max)
{
  bool cut;
  GString *out;

  if (text == NULL)
    return NULL;
  out = escape (text, max, &cut);
  if (cut)
    g_string_append_printf (out, "... (%zu bytes)", strlen (text));
  return g_string_free (out, FALSE);
}
