/*
 * network.h - `--net auto`: the NCCL/UCX/Gloo settings cohort doctor
 * derives for this node, added to the workers' environment (env.h).
 *
 * Main thread only.
 */
#ifndef COHORT_AGENT_NETWORK_H
#define COHORT_AGENT_NETWORK_H

#include "doctor/doctor.h"

/*
 * Derives the settings toward master (NULL on one node) and logs doctor's
 * warnings; across nodes also prints the settings added. iface: the
 * interface this agent reached node 0 on (cluster.h), which the socket
 * settings then name, or NULL/"" to let doctor derive it. Returns the
 * result, or NULL when nothing could be derived (a warning says why).
 * COHORT_DOCTOR_ROOT, when set, names a directory holding sys/, proc/,
 * dev/, lib/ and an ifaddrs file that stand for this machine.
 */
doctor_result *agent_network_derive(int multinode, const char *master, const char *iface);

#endif
