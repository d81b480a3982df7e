/*
 * topo.h - the node's CPUs and GPUs, as the agent needs them to count and
 * place its workers (`--nproc-per-node gpu|auto`, `--numa-binding`,
 * `--cpu-bind`).
 *
 * topo_probe() reads, relative to roots as doctor_probe() does (tests point
 * them at fixture trees):
 *
 *   CPUs  SYSFS/devices/system/cpu/online; per CPU its socket
 *         (topology/physical_package_id), its physical core (the lowest of
 *         topology/thread_siblings_list) and its last-level cache (the lowest
 *         CPU of the highest-level data or unified cache's shared_cpu_list,
 *         the socket when no cache is described); NUMA nodes from
 *         SYSFS/devices/system/node/node<N>/cpulist (node 0 when absent).
 *   GPUs  NVIDIA: PROC/driver/nvidia/gpus/<PCI address>/ in PCI order (CUDA's
 *         order under CUDA_DEVICE_ORDER=PCI_BUS_ID), the UUID from its
 *         `information` file, the NUMA node from
 *         SYSFS/bus/pci/devices/<address>/numa_node; without that directory,
 *         DEV/nvidia<N> (NUMA node unknown). Else AMD render nodes:
 *         SYSFS/class/drm/renderD<N>/device with vendor 0x1002.
 *         The GPUs a process there would see: CUDA_VISIBLE_DEVICES (for AMD,
 *         HIP_VISIBLE_DEVICES first) from the environment given, read as
 *         CUDA reads it: indices or GPU-UUID prefixes, in the order given, up
 *         to the first entry that names no GPU or one already named; empty:
 *         none.
 *
 * A NUMA node of -1 (one-node machines often say so) counts as node 0, as
 * PyTorch's binding does.
 *
 * Thread safety: no global state.
 */
#ifndef COHORT_DOCTOR_TOPO_H
#define COHORT_DOCTOR_TOPO_H

#include <sched.h>
#include <stddef.h>

#define TOPO_MAX_CPUS CPU_SETSIZE
#define TOPO_MAX_GPUS 64

typedef struct topo_cpu {
  int id;
  int socket;
  int core;  /* the lowest CPU sharing this one's physical core */
  int cache; /* the lowest CPU sharing its last-level cache */
  int numa;
} topo_cpu;

typedef enum topo_vendor { TOPO_NO_GPU, TOPO_NVIDIA, TOPO_AMD } topo_vendor;

typedef struct topo_gpu {
  char pci[32];  /* "0000:3b:00.0", "" when unknown */
  char uuid[64]; /* "GPU-...", "" when unknown */
  int numa;
} topo_gpu;

typedef struct topo {
  int ncpu;
  topo_cpu cpu[TOPO_MAX_CPUS]; /* the online CPUs, by id */
  topo_vendor vendor;
  int nfound;                  /* GPUs present */
  int ngpu;                    /* of them, visible (CUDA_VISIBLE_DEVICES) */
  topo_gpu gpu[TOPO_MAX_GPUS]; /* the visible ones, in visible order */
  char visible_var[24];        /* the variable that chose them, "" none */
} topo;

typedef struct topo_config {
  const char *sysfs_root; /* NULL: "/sys" */
  const char *proc_root;  /* NULL: "/proc" */
  const char *dev_root;   /* NULL: "/dev" */
  char *const *envp;      /* CUDA_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES; NULL: none set */
} topo_config;

/*
 * Reads the topology into *t (large: allocate it). Returns 0, or -errno
 * with one line in err when the CPUs cannot be read (-ENOENT: no
 * SYSFS/devices/system/cpu/online). Finding no GPU is not an error.
 */
int topo_probe(const topo_config *cfg, topo *t, char *err, size_t errlen);

/*
 * Parses a Linux CPU list ("0-3,8,10-11", white space around it ignored)
 * into out. Returns 0, or -EINVAL (bad syntax, a descending range, a CPU
 * at or above TOPO_MAX_CPUS).
 */
int topo_parse_cpulist(const char *s, cpu_set_t *out);

/* The list form of set ("0-3,8"; "" when empty), cut short with "..." if len is too small. */
void topo_format_cpulist(const cpu_set_t *set, char *out, size_t len);

#endif
