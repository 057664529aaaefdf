/* Handing work back to a main context from a thread of its own.
 *
 * g_main_context_invoke calls its function on the calling thread
 * whenever that thread can acquire the context, which it can whenever
 * the main thread is not inside its loop: mloopd takes over its devices
 * before its loop runs and stops after it, and a start's or a
 * connect's outcome would then run on the waiting thread beside the
 * main thread's own use of the keeper, the table of starts and mloopd's
 * table of devices.  This always queues: FN runs from CONTEXT's loop.
 */
#ifndef MLOOP_SUPERVISOR_ON_CONTEXT_H
#define MLOOP_SUPERVISOR_ON_CONTEXT_H

#include <glib.h>

/* Runs FN (DATA) from CONTEXT's loop, once, at the default priority;
 * FN's return value is ignored.
 */
void on_context_soon (GMainContext *context, GSourceFunc fn, gpointer data);

#endif /* MLOOP_SUPERVISOR_ON_CONTEXT_H */
