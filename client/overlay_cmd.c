/* mloop — the overlay command.  See overlay_cmd.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <glib.h>

#include "overlay_cmd.h"
#include "overlay_file.h"
#include "print.h"
#include "printable.h"

#define fail mloop_print_error

int
mloop_cmd_overlay (int argc, char **argv)
{
  g_autofree char *base_arg = NULL;
  gboolean adopt = FALSE;
  GOptionEntry entries[] = {
    { "base", 0, 0, G_OPTION_ARG_FILENAME, &base_arg,
      "commit: the base to write, where it is not (or no longer) at the "
      "path the overlay records", "FILE" },
    { "adopt-base", 0, 0, G_OPTION_ARG_NONE, &adopt,
      "commit: write the base although it is not the image the overlay "
      "was made for", NULL },
    G_OPTION_ENTRY_NULL
  };
  g_autoptr (GOptionContext) ctx =
    g_option_context_new ("commit|discard|clear OVERLAY, or adopt OVERLAY "
                          "IMAGE");
  g_autoptr (GError) gerr = NULL;
  g_autofree char *base = NULL;
  char err[1024];

  g_option_context_set_summary (ctx, "An overlay file no device uses: "
                                "commit copies its writes into the base it "
                                "was made for, then removes it; discard "
                                "removes it, its writes lost; adopt records "
                                "IMAGE as its base, though it was made for "
                                "another; clear forgets a sync of it that "
                                "failed (until then every server of it "
                                "fails each flush): once its data was "
                                "checked.");
  g_option_context_add_main_entries (ctx, entries, NULL);
  if (!g_option_context_parse (ctx, &argc, &argv, &gerr))
    return fail ("%s", gerr->message);
  if (argc == 4 && strcmp (argv[1], "adopt") == 0) {
    if (base_arg || adopt)
      return fail ("overlay adopt: --base and --adopt-base are commit's");
    if (mloop_overlay_file_adopt (argv[2], argv[3], err, sizeof err) == -1)
      return fail ("overlay adopt: %s", err);
    return EXIT_SUCCESS;
  }
  if (argc == 3 && strcmp (argv[1], "clear") == 0) {
    if (base_arg || adopt)
      return fail ("overlay clear: --base and --adopt-base are commit's");
    if (mloop_overlay_file_clear (argv[2], err, sizeof err) == -1)
      return fail ("overlay clear: %s", err);
    return EXIT_SUCCESS;
  }
  if (argc != 3 || (strcmp (argv[1], "commit") != 0 &&
                    strcmp (argv[1], "discard") != 0))
    return fail ("overlay: give commit, discard or clear and one OVERLAY "
                 "file, or adopt, OVERLAY and IMAGE");
  if (strcmp (argv[1], "commit") == 0) {
    g_autofree char *shown = NULL;

    if (mloop_overlay_file_commit (argv[2], base_arg, adopt, &base, err,
                                   sizeof err) == -1)
      return fail ("overlay commit: %s", err);
    /* The path an overlay's header records, anyone's to choose: its
     * control characters escaped, as mloop list shows names.
     */
    shown = mloop_printable (base);
    printf ("%s\n", shown);
    return EXIT_SUCCESS;
  }
  if (base_arg || adopt)
    return fail ("overlay discard: --base and --adopt-base are commit's");
  if (mloop_overlay_file_discard (argv[2], err, sizeof err) == -1)
    return fail ("overlay discard: %s", err);
  return EXIT_SUCCESS;
}
