/*
 * launcher.h - the agent's end of `cohort launch`. With --launcher-stdin,
 * the agent's standard input is its ssh session to the launcher, and a
 * thread reads it: a "stop" line is the launcher's request to stop (the
 * agent gets SIGTERM, as from a terminal); end of file means the launcher
 * or the connection to it is gone, and the agent gets SIGHUP with
 * agent_launcher_lost() turning 1, so that its report names that cause. The
 * agent's own signal handling does the rest, so a stop behaves the same in
 * rendezvous, while workers run and while it waits for the other nodes.
 */
#ifndef COHORT_AGENT_LAUNCHER_H
#define COHORT_AGENT_LAUNCHER_H

/*
 * Starts the (detached) reading thread on fd, which it owns from then on.
 * It blocks in read() for the agent's life: the launcher's end is what
 * bounds it. Returns 0 or -errno.
 */
int agent_launcher_watch_start(int fd);

/* 1 once end of file was read on the launcher's connection. Thread-safe. */
int agent_launcher_lost(void);

#endif
