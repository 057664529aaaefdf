/* mloop — where a program finds one of mloop's own loadable modules
 * (a library kept out of the program's start because few runs need it:
 * GnuTLS for mloop-server --tls, gio and json-glib for the mloop
 * command's D-Bus and JSON).
 */
#ifndef MLOOP_MODULE_PATH_H
#define MLOOP_MODULE_PATH_H

#include <stddef.h>

/* The directory of the file the running program is, as the kernel runs
 * it (/proc/self/exe), in DIR: 0, or -1 when unknown.  Not the program's
 * name (argv[0], dladdr's name for it), which is its caller's to choose:
 * a symbolic link of theirs to /usr/bin/mloop, or exec -a.
 */
int mloop_program_dir (char *dir, size_t len);

/* The path of MODULE in PATH: $ENV_VAR when ENV_VAR is not NULL and the
 * variable is set (tests); else the module next to the running program,
 * as in the build tree; else the installed one in MLOOP_PKGLIBDIR.
 */
void mloop_module_path (const char *module, const char *env_var, char *path,
                        size_t len);

#endif /* MLOOP_MODULE_PATH_H */
