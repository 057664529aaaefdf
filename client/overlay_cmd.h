/* mloop — the overlay command: `mloop overlay commit|discard FILE` and
 * `mloop overlay adopt FILE IMAGE`.
 */
#ifndef MLOOP_OVERLAY_CMD_H
#define MLOOP_OVERLAY_CMD_H

int mloop_cmd_overlay (int argc, char **argv);

#endif /* MLOOP_OVERLAY_CMD_H */
