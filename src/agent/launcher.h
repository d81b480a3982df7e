/*
 * launcher.h - the agent's end of `cohort launch`. With --launcher-stdin,
 * the agent's standard input is its ssh session to the launcher: its first
 * line is the job's token, then a thread reads it: a "stop" line is the
 * launcher's request to stop (the agent gets SIGTERM, as from a terminal);
 * end of file means the launcher or the connection to it is gone, and the
 * agent gets SIGHUP with agent_launcher_lost() turning 1, so that its
 * report names that cause. The agent's own signal handling does the rest,
 * so a stop behaves the same in rendezvous, while workers run and while it
 * waits for the other nodes.
 */
#ifndef COHORT_AGENT_LAUNCHER_H
#define COHORT_AGENT_LAUNCHER_H

#include <stddef.h>

/*
 * The handshake's end on the agent's side (docs/launch.md): the job's token,
 * the first line the launcher writes once every host has answered its
 * version. Reads fd one byte at a time, so that nothing after the line is
 * taken from the reading thread. out gets the line without its newline.
 * Returns 0; -ENODATA when fd ended first (the launcher started nothing);
 * -EINVAL for an empty line or one of cap bytes or more; -errno on a read
 * error.
 */
int agent_launcher_read_token(int fd, char *out, size_t cap);

/*
 * Starts the (detached) reading thread on fd, which it owns from then on.
 * It blocks in read() for the agent's life: the launcher's end is what
 * bounds it. Returns 0 or -errno.
 */
int agent_launcher_watch_start(int fd);

/* 1 once end of file was read on the launcher's connection. Thread-safe. */
int agent_launcher_lost(void);

#endif
