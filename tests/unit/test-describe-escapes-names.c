/* How devices are described (device/describe.c) when an image's name,
 * chosen by a user through mloop's D-Bus service, holds control
 * characters: `mloop list` and `mloop status` show none of them raw
 * (ESC, the C1 CSI, DEL, a byte that is not UTF-8) but escaped, with
 * printable UTF-8 kept; nor the invisible characters that reorder or
 * hide what is shown (Unicode's bidi controls, such as RLO making
 * "gmi.toor" read "root.img", zero-width ones, and every other format
 * character: the soft hyphen, the deprecated shaping controls, tag
 * characters that hide a text within the name), nor the line and
 * paragraph separators, at which viewers break lines; `mloop list --json`
 * holds no raw control byte nor invisible character either and gives
 * the exact name back to a JSON reader.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <glib.h>
#include <json-glib/json-glib.h>

#include "describe.h"
#include "server_kind.h"
#include "unit.h"

/* ESC [2J (clear the screen), CSI as U+009B, DEL, a backslash, a tab,
 * and a printable non-ASCII letter.
 */
#define HOSTILE "/home/u/a\x1b[2J\xc2\x9b" "1m\x7f\\\tz\xc3\xa9.img"
#define HOSTILE_SHOWN "/home/u/a\\x1b[2J\\xc2\\x9b1m\\x7f\\\\\\x09z\xc3\xa9.img"
/* RLO (U+202E) reversing what follows, ZWSP (U+200B), the byte order
 * mark (U+FEFF), LRI (U+2066), ALM (U+061C), WJ (U+2060) and LRM
 * (U+200E).
 */
#define SPOOFED "/home/u/x\xe2\x80\xaegmi.toor\xe2\x80\x8b\xef\xbb\xbf" \
  "\xe2\x81\xa6\xd8\x9c\xe2\x81\xa0\xe2\x80\x8e.img"
#define SPOOFED_SHOWN "/home/u/x\\xe2\\x80\\xaegmi.toor\\xe2\\x80\\x8b" \
  "\\xef\\xbb\\xbf\\xe2\\x81\\xa6\\xd8\\x9c\\xe2\\x81\\xa0\\xe2\\x80\\x8e.img"
/* The line separator (U+2028), which a log viewer may break a line at,
 * the soft hyphen (U+00AD), NATIONAL DIGIT SHAPES (U+206E), an
 * interlinear annotation anchor (U+FFF9), the Mongolian vowel separator
 * (U+180E), a tag character (U+E0041, invisible text) and the paragraph
 * separator (U+2029): format characters and separators beyond those
 * above.
 */
#define HIDDEN "/home/u/y\xe2\x80\xa8root\xc2\xad\xe2\x81\xae\xef\xbf\xb9" \
  "\xe1\xa0\x8e\xf3\xa0\x81\x81\xe2\x80\xa9.img"
#define HIDDEN_SHOWN "/home/u/y\\xe2\\x80\\xa8root\\xc2\\xad\\xe2\\x81" \
  "\\xae\\xef\\xbf\\xb9\\xe1\\xa0\\x8e\\xf3\\xa0\\x81\\x81\\xe2\\x80" \
  "\\xa9.img"
#define HIDDEN_JSON "/home/u/y\\u2028root\\u00ad\\u206e\\ufff9\\u180e" \
  "\\udb40\\udc41\\u2029.img"
#define NOT_UTF8 "/home/u/b\x9b" "31m.img"
#define NOT_UTF8_SHOWN "/home/u/b\\x9b31m.img"

static char *
describe (const struct mloop_device_state *list, size_t n, int how)
{
  char *text = NULL;
  size_t size;
  FILE *f = open_memstream (&text, &size);
  struct mloop_device_status st = { 0 };

  CHECK (f != NULL, "open_memstream failed");
  if (how == 2)
    mloop_describe_status (f, &list[0], &st, false);
  else
    mloop_describe_list (f, list, n, how == 1);
  CHECK (fclose (f) == 0, "fclose failed");
  return text;
}

/* No byte of TEXT is a control character but the newlines. */
static void
check_no_control (const char *what, const char *text)
{
  for (const unsigned char *p = (const unsigned char *) text; *p; p++) {
    bool c1 = *p == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f;

    CHECK (*p == '\n' || (*p >= 0x20 && *p != 0x7f && *p != 0x9b && !c1),
           "%s: a raw control byte 0x%02x at %td in: %s", what, *p,
           (const char *) p - text, text);
  }
}

/* No character of TEXT is one that reorders or hides what follows. */
static void
check_no_invisible (const char *what, const char *text)
{
  for (const char *p = text; *p; p = g_utf8_next_char (p)) {
    gunichar c = g_utf8_get_char_validated (p, -1);
    bool invisible = c == 0x061c || (c >= 0x200b && c <= 0x200f) ||
      (c >= 0x202a && c <= 0x202e) || (c >= 0x2060 && c <= 0x2064) ||
      (c >= 0x2066 && c <= 0x2069) || c == 0xfeff || c == 0x00ad ||
      c == 0x180e || c == 0x2028 || c == 0x2029 ||
      (c >= 0x206a && c <= 0x206f) || (c >= 0xfff9 && c <= 0xfffb) ||
      (c >= 0xe0000 && c <= 0xe007f);

    CHECK (c != (gunichar) -1 && c != (gunichar) -2 && !invisible,
           "%s: U+%04X (or a byte that is not UTF-8) at %td in: %s", what,
           (unsigned) c, p - text, text);
  }
}

int
main (void)
{
  struct mloop_device_state list[4] = {
    { .index = 0, .file = (char *) HOSTILE, .overlay = (char *) HOSTILE,
      .size = 1 << 20, .block_size = 512, .connections = 1, .threads = 1,
      .owner = 65534, .server = mloop_server_kind_default () },
    { .index = 1, .file = (char *) NOT_UTF8, .size = 1 << 20,
      .block_size = 512, .connections = 1, .threads = 1, .owner = 65534,
      .server = mloop_server_kind_default () },
    { .index = 2, .file = (char *) SPOOFED, .size = 1 << 20,
      .block_size = 512, .connections = 1, .threads = 1, .owner = 65534,
      .server = mloop_server_kind_default () },
    { .index = 3, .file = (char *) HIDDEN, .size = 1 << 20,
      .block_size = 512, .connections = 1, .threads = 1, .owner = 65534,
      .server = mloop_server_kind_default () },
  };
  g_autofree char *table = describe (list, 4, 0);
  g_autofree char *json = describe (list, 4, 1);
  g_autofree char *status = describe (list, 3, 2);
  g_autofree char *spoofed_status = describe (&list[2], 1, 2);
  g_autofree char *hidden_status = describe (&list[3], 1, 2);
  g_autoptr (JsonParser) parser = json_parser_new ();
  g_autoptr (GError) gerr = NULL;
  JsonArray *devices;

  check_no_control ("list", table);
  CHECK (strstr (table, HOSTILE_SHOWN " (overlay " HOSTILE_SHOWN ")"),
         "list does not show the escaped name: %s", table);
  CHECK (strstr (table, NOT_UTF8_SHOWN), "list: %s", table);
  check_no_control ("status", status);
  CHECK (strstr (status, "/dev/nbd0: " HOSTILE_SHOWN "\n"), "status: %s",
         status);
  CHECK (strstr (status, "overlay: " HOSTILE_SHOWN), "status: %s", status);
  CHECK (strstr (table, SPOOFED_SHOWN), "list: %s", table);
  check_no_invisible ("list (a spoofing name)", strstr (table, "/home/u/x"));
  CHECK (strstr (spoofed_status, "/dev/nbd2: " SPOOFED_SHOWN "\n"),
         "status: %s", spoofed_status);
  check_no_invisible ("status (a spoofing name)", spoofed_status);
  CHECK (strstr (table, HIDDEN_SHOWN), "list: %s", table);
  check_no_invisible ("list (a name hiding text)",
                      strstr (table, "/home/u/y"));
  CHECK (strstr (hidden_status, "/dev/nbd3: " HIDDEN_SHOWN "\n"),
         "status: %s", hidden_status);
  check_no_invisible ("status (a name hiding text)", hidden_status);
  CHECK (strstr (json, HIDDEN_JSON), "list --json: %s", json);
  check_no_control ("list --json", json);
  check_no_invisible ("list --json", json);
  CHECK (json_parser_load_from_data (parser, json, -1, &gerr),
         "list --json is not JSON: %s: %s", gerr ? gerr->message : "",
         json);
  devices = json_node_get_array (json_parser_get_root (parser));
  CHECK (strcmp (json_object_get_string_member
                 (json_array_get_object_element (devices, 0), "file"),
                 HOSTILE) == 0, "list --json changed the name: %s", json);
  CHECK (strcmp (json_object_get_string_member
                 (json_array_get_object_element (devices, 1), "file"),
                 NOT_UTF8_SHOWN) == 0,
         "list --json: a name that is not UTF-8: %s", json);
  CHECK (strcmp (json_object_get_string_member
                 (json_array_get_object_element (devices, 2), "file"),
                 SPOOFED) == 0, "list --json changed a spoofing name: %s",
         json);
  CHECK (strcmp (json_object_get_string_member
                 (json_array_get_object_element (devices, 3), "file"),
                 HIDDEN) == 0, "list --json changed a name hiding text: %s",
         json);
  return EXIT_SUCCESS;
}
