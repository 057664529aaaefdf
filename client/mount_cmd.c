/* mloop — the mount and umount commands, and mount(8)'s helper. */
#include <stdio.h>
#include <stdlib.h>

#include <glib.h>

#include "mount.h"
#include "print.h"
#include "mount_cmd.h"

#define fail mloop_print_error

int
mloop_cmd_mount (int argc, char **argv)
{
  g_autofree char *options = NULL, *fstype = NULL, *server = NULL;
  gboolean sloppy = FALSE, fake = FALSE, no_mtab = FALSE, verbose = FALSE;
  GOptionEntry entries[] = {
    { "options", 'o', 0, G_OPTION_ARG_STRING, &options,
      "Mount options, as mount -o (\"ro\" also attaches read-only)",
      "OPTS" },
    { "types", 't', 0, G_OPTION_ARG_STRING, &fstype,
      "Filesystem type (default: mount finds out)", "TYPE" },
    /* No short form: mount(8) passes its helpers -s for "sloppy". */
    { "server", 0, 0, G_OPTION_ARG_STRING, &server,
      "native (default) or nbdkit", "KIND" },
    /* What mount(8) passes its helpers; mount has acted on them. */
    { "sloppy", 's', G_OPTION_FLAG_HIDDEN, G_OPTION_ARG_NONE, &sloppy,
      NULL, NULL },
    { "fake", 'f', G_OPTION_FLAG_HIDDEN, G_OPTION_ARG_NONE, &fake, NULL, NULL },
    { "no-mtab", 'n', G_OPTION_FLAG_HIDDEN, G_OPTION_ARG_NONE, &no_mtab,
      NULL, NULL },
    { "verbose", 'v', G_OPTION_FLAG_HIDDEN, G_OPTION_ARG_NONE, &verbose,
      NULL, NULL },
    G_OPTION_ENTRY_NULL
  };
  g_autoptr (GOptionContext) ctx = g_option_context_new ("FILE DIR");
  g_autoptr (GError) gerr = NULL;
  struct mloop_mount_request req = { .attach = { .index = -1 } };
  char err[1024];
  int index;

  g_option_context_set_summary (ctx, "Attach FILE and mount it on DIR; "
                                "the last unmount detaches it.");
  g_option_context_add_main_entries (ctx, entries, NULL);
  if (!g_option_context_parse (ctx, &argc, &argv, &gerr))
    return fail ("mount: %s", gerr->message);
  if (argc != 3)
    return fail ("mount: give FILE and DIR (see mloop mount --help)");
  if (fake)
    return EXIT_SUCCESS;
  if (server && (req.attach.server = mloop_server_kind_find (server, err,
                                                             sizeof err))
      == NULL)
    return fail ("mount: --server %s", err);
  req.attach.file = argv[1];
  req.dir = argv[2];
  req.fstype = fstype;
  req.options = options;
  mloop_mount_parse_options (&req);
  if (mloop_mount (&req, &index, err, sizeof err) == -1)
    return fail ("mount %s on %s: %s", argv[1], argv[2], err);
  if (verbose)
    printf ("%s mounted on %s through /dev/nbd%d\n", argv[1], argv[2], index);
  return EXIT_SUCCESS;
}

int
mloop_cmd_umount (int argc, char **argv)
{
  g_autoptr (GOptionContext) ctx = g_option_context_new ("DIR");
  g_autoptr (GError) gerr = NULL;
  char err[1024];

  g_option_context_set_summary (ctx, "Unmount DIR and detach its mloop "
                                "device.");
  if (!g_option_context_parse (ctx, &argc, &argv, &gerr))
    return fail ("umount: %s", gerr->message);
  if (argc != 2)
    return fail ("umount: give one DIR (see mloop umount --help)");
  if (mloop_umount (argv[1], err, sizeof err) == -1)
    return fail ("umount %s: %s", argv[1], err);
  return EXIT_SUCCESS;
}
