/* The kernel's own words on why it dropped a connection of an nbd
 * device, from /dev/kmsg (drivers/block/nbd.c): a request outlived the
 * request timeout ("Connection timed out, retrying"), a send failed
 * ("Send control failed", "Send data failed", "Request send failed"),
 * or a receive did ("Receive control failed", which also follows a
 * timeout, whose shutdown ends the receive).
 *
 * One reader per process, however many devices it keeps: a descriptor
 * per device would read every kernel line once per device, and count
 * against the process's descriptors a thousand times over.  What it
 * reads is kept per device until that device's keeper asks.
 */
#ifndef MLOOP_SUPERVISOR_KERNEL_LOG_H
#define MLOOP_SUPERVISOR_KERNEL_LOG_H

/* Begins reading the kernel log from its end, on the first hold;
 * closes it with the last release.
 */
void kernel_log_hold (void);
void kernel_log_release (void);

/* The most telling reason the kernel gave for /dev/nbdINDEX since the
 * last call for INDEX (the latest of the most telling, within the last
 * two minutes): a short name ("request timeout", "send failed",
 * "receive failed") with *LINE, the kernel's words (g_free), or NULL.
 */
const char *kernel_log_reason (int index, char **line);

#endif /* MLOOP_SUPERVISOR_KERNEL_LOG_H */
