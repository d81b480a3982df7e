/*
 * signals.h - the agent's signals through a self-pipe.
 *
 * The handler writes the signal number to a pipe the agent's loop polls
 * (and, while no worker exists, ends the agent at once on a stop signal).
 * The watcher thread (watch.h) writes WATCH_NOTIFY_BYTE to the same pipe,
 * so one read end carries every event the loop reacts to.
 *
 * Process-wide state: one agent per process, installed by the main thread.
 */
#ifndef COHORT_AGENT_SIGNALS_H
#define COHORT_AGENT_SIGNALS_H

#include <stddef.h>
#include <sys/types.h>

/* Creates the pipe and installs the handlers (SIGCHLD, the stop signals,
 * SIGUSR1/2, SIGQUIT; SIGPIPE ignored). Returns 0 or -errno. */
int agent_signals_install(void);
/* Default dispositions back, the pipe closed. */
void agent_signals_restore(void);

/* The read end, for poll(). */
int agent_signals_fd(void);
/* The write end, for other threads' notifications (WATCH_NOTIFY_BYTE). */
int agent_signals_notify_fd(void);
/* Reads the events pending (non-blocking): their count, 0 when none. */
ssize_t agent_signals_read(unsigned char *buf, size_t len);

/* Whether workers exist: without them a stop signal ends the agent at once. */
void agent_signals_set_workers(int running);
/* A directory (the error files') for the handler to remove when a signal
 * ends the agent; "" for none. */
void agent_signals_set_dir(const char *dir);

/* 1 for the signals that stop the job (SIGINT, SIGTERM, SIGHUP). */
int agent_signals_is_stop(int sig);

#endif
