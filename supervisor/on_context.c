/* Handing work back to a main context (on_context.h). */
#include "on_context.h"

void
on_context_soon (GMainContext *context, GSourceFunc fn, gpointer data)
{
  GSource *idle = g_idle_source_new ();

  g_source_set_priority (idle, G_PRIORITY_DEFAULT);
  g_source_set_callback (idle, fn, data, NULL);
  g_source_attach (idle, context);
  g_source_unref (idle);
}
