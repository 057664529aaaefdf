/* mloop — the module mloop-cli-extras.so: its table.  See extras.h. */
#include "describe.h"
#include "extras.h"

/* The loader looks it up by name (MLOOP_CLI_EXTRAS_SYMBOL). */
const struct mloop_cli_extras mloop_cli_extras
  __attribute__ ((visibility ("default"))) = {
  .describe_list = mloop_describe_list,
  .describe_status = mloop_describe_status,
  .service_attach = mloop_service_attach,
  .service_detach = mloop_service_detach,
  .service_list = mloop_service_list,
};
