/*
 * place.h - how many workers this node runs and which CPUs each may use:
 * `--nproc-per-node cpu|gpu|auto` counted on the node, torchrun's
 * `--numa-binding` and cohort's `--cpu-bind` (docs/torchrun.md).
 *
 * agent_place_count() and agent_place_plan() are pure functions of a topology (topo.h)
 * and the CPUs the agent may use, so tests run them on fixture trees;
 * agent_place_resolve() reads the machine (or the roots the configuration names)
 * and does both, once, when the agent starts.
 *
 * The plans, local rank i on the visible GPU i where a GPU is involved:
 *   cores   the CPUs split into nproc slices of whole physical cores, evenly
 *           (the first ones one core more), without overlap; logical CPUs
 *           when there are fewer cores than ranks.
 *   numa    ranks spread over the NUMA nodes in blocks; each node's CPUs split
 *           among its ranks as cores does.
 *   node    all CPUs of the GPU's NUMA node.
 *   socket  all CPUs of the socket that holds the GPU's NUMA node.
 *   exclusive  the physical cores of the GPU's NUMA node split among the
 *           GPUs on that node, without overlap.
 *   core-complex  one last-level cache's CPUs (a core complex) of the GPU's
 *           NUMA node, the largest first, shared only when the node has
 *           more GPUs than complexes.
 *
 * Thread safety: no global state.
 */
#ifndef COHORT_AGENT_PLACE_H
#define COHORT_AGENT_PLACE_H

#include <sched.h>
#include <stddef.h>
#include <stdio.h>

#include "agent/agent.h"
#include "doctor/topo.h"

typedef struct placement {
  int nproc;
  cpu_set_t *cpus; /* nproc sets, by local rank; NULL: no binding */
  int omp;         /* OMP_NUM_THREADS is each set's size unless the user set it */
} placement;

/*
 * The worker count kind asks for on topology t (AGENT_NPROC_NUMBER: n as
 * given). Returns 0, or -ENODEV with one line in err (gpu on a node that
 * shows none).
 */
int agent_place_count(const topo *t, agent_nproc kind, int n, int *nproc, char *err, size_t errlen);

/*
 * The CPU set of each of nproc local ranks under mode (not AGENT_BIND_NONE),
 * from t's CPUs that are in allowed (NULL: all). Returns 0, or -EINVAL with
 * one line in err: more ranks than CPUs (or, for exclusive, than cores), a
 * GPU mode with fewer visible GPUs than ranks, a GPU whose NUMA node has no
 * allowed CPU.
 */
int agent_place_plan(const topo *t, const cpu_set_t *allowed, agent_bind mode, int nproc,
                     cpu_set_t *sets, char *err, size_t errlen);

/*
 * Counts and plans for cfg on this machine (cfg's roots, envp for
 * CUDA_VISIBLE_DEVICES, the agent's own affinity as the allowed CPUs), and
 * prints each bound rank's CPU list to log once. Reads nothing when cfg
 * asks for a number of workers and no binding. Returns 0 or -errno with
 * one line in err.
 */
int agent_place_resolve(const agent_config *cfg, char *const *envp, FILE *log, placement *out,
                        char *err, size_t errlen);

void agent_place_free(placement *p);

#endif
