/*
 * doctor.h - probe a node's RDMA devices, network interfaces and limits, and
 * derive the NCCL / UCX / Gloo environment a training job needs there.
 *
 * Two steps, usable apart or together:
 *
 *   doctor_probe()   reads the machine (or a fixture tree standing in for it)
 *                    into a doctor_facts. Every path is taken relative to the
 *                    roots in doctor_config, so tests point it at committed
 *                    trees under tests/fixtures/doctor/.
 *   doctor_derive()  is a pure function of the facts, the options and the
 *                    caller's environment: it lists the variables to add (each
 *                    with a one-line reason), never one already set in envp,
 *                    plus notes, warnings and errors, a compact summary
 *                    that agents compare across nodes, and the verdicts of
 *                    `cohort doctor --check` (check.c).
 *
 *   doctor_plan()    does both; this is what `cohort run --net auto` calls.
 *
 * Typical use by the agent:
 *
 *   doctor_config cfg = {0};              // roots default to /sys /proc /dev /
 *   cfg.master = master_host;             // may be NULL
 *   doctor_result *r;
 *   int rc = doctor_plan(&cfg, environ, &r);
 *   if (rc == 0) {
 *     for (size_t i = 0; i < r->nset; i++) setenv(r->set[i].name, r->set[i].value, 0);
 *     ... r->warnings, r->errors (non-empty: the node cannot use RDMA as found)
 *     char text[DOCTOR_SUMMARY_MAX];
 *     doctor_summary_format(&r->summary, text, sizeof text);  // publish in the store
 *   }
 *   doctor_result_destroy(r);
 *
 *   // later, with another node's published text:
 *   doctor_summary other;
 *   if (doctor_summary_parse(their_text, &other) == 0 &&
 *       doctor_summary_compare("node0", &r->summary, "node3", &other, msg, sizeof msg) == 1)
 *     log the warning in msg
 *
 * Errors: functions return 0 or a negative errno-style code (-ENOMEM,
 * -EINVAL, -ENOTDIR for a root that is not a directory). Findings about the
 * machine (a port down, no qualifying GID) are never return codes: they are
 * the warnings and errors inside the result.
 *
 * Thread safety: no global state; distinct objects may be used from distinct
 * threads. doctor_probe() in live mode calls getifaddrs() and getaddrinfo()
 * (the latter can block for the resolver's own timeout when the master is a
 * host name that must be looked up).
 */
#ifndef COHORT_DOCTOR_DOCTOR_H
#define COHORT_DOCTOR_DOCTOR_H

#include <stddef.h>
#include <stdint.h>

#define DOCTOR_NAME_MAX 64     /* device, port and interface names, with the NUL */
#define DOCTOR_SUMMARY_MAX 640 /* doctor_summary_format() output, with the NUL */

typedef struct doctor_config {
  const char *sysfs_root; /* NULL: "/sys" */
  const char *proc_root;  /* NULL: "/proc" (net/route, net/ipv6_route, self/limits, meminfo) */
  const char *dev_root;   /* NULL: "/dev" (infiniband/, shm) */
  const char *lib_root;   /* NULL: "/"; NCCL libraries and headers are looked for under it */
  const char *master;     /* host name or address of the rendezvous master, or NULL */
  /*
   * NULL (production): interface addresses come from getifaddrs() and the
   * interface that reaches the master from a UDP connect() + getsockname()
   * (no packet is sent). Otherwise the path of a file describing the
   * addresses, one "IFNAME ADDRESS/PREFIX" per line ('#' starts a comment),
   * and the route to the master is the longest matching prefix in
   * PROC_ROOT/net/route (IPv4) or net/ipv6_route (IPv6): this is how fixture
   * trees describe a machine.
   */
  const char *ifaddrs_file;
  int set_gid_index; /* set NCCL_IB_GID_INDEX even when the installed NCCL picks it */
  /*
   * 0 (cohort doctor): look for NCCL always, to report it. 1 (the agent):
   * only where a derived setting depends on its version, i.e. on machines
   * with RoCE ports (NCCL_IB_GID_INDEX); elsewhere the search (globs over
   * the library directories, nccl.h read line by line) was half of an
   * agent's CPU for nothing.
   */
  int nccl_if_needed;
  /*
   * NULL (cohort doctor): the socket interface is derived (the one that
   * reaches the master, see docs/doctor.md). Otherwise the interface the
   * caller already reaches node 0 on (the agent's; "lo" when every node is
   * on this machine): NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME and, without
   * RDMA, UCX_NET_DEVICES name it, as the workers' sockets will use it.
   */
  const char *socket_iface;
} doctor_config;

typedef enum doctor_link {
  DOCTOR_LINK_UNKNOWN = 0,
  DOCTOR_LINK_IB,  /* link_layer "InfiniBand" */
  DOCTOR_LINK_ETH, /* link_layer "Ethernet": RoCE */
} doctor_link;

typedef enum doctor_gid_type {
  DOCTOR_GID_UNKNOWN = 0, /* gid_attrs/types/I missing or unreadable */
  DOCTOR_GID_IB_ROCE_V1,  /* "IB/RoCE v1" */
  DOCTOR_GID_ROCE_V2,     /* "RoCE v2" */
} doctor_gid_type;

typedef struct doctor_gid {
  int index;       /* the N of ports/P/gids/N */
  uint8_t raw[16]; /* the GID, network order */
  doctor_gid_type type;
  char ndev[DOCTOR_NAME_MAX]; /* gid_attrs/ndevs/N, "" when none */
} doctor_gid;

typedef struct doctor_port {
  int num;                  /* port number (1-based in sysfs) */
  int state;                /* 4 = ACTIVE; -1 when unreadable */
  char state_name[32];      /* "ACTIVE", "DOWN", ... */
  int phys_state;           /* 5 = LinkUp; -1 when unreadable */
  char phys_state_name[48]; /* "LinkUp", "Polling", ... */
  char rate[64];            /* as sysfs prints it: "200 Gb/sec (4X HDR)" */
  double rate_gbps;         /* 0 when unknown */
  doctor_link link;
  doctor_gid *gids; /* populated entries only (all-zero GIDs skipped), ascending index */
  size_t ngids;
} doctor_port;

typedef struct doctor_hca {
  char name[DOCTOR_NAME_MAX];       /* "mlx5_0", "mlx5_bond_0" */
  char pci[DOCTOR_NAME_MAX];        /* "0000:3b:00.0", "" when unknown */
  int numa;                         /* device/numa_node; -1 when unknown or not reported */
  char (*netdevs)[DOCTOR_NAME_MAX]; /* the entries of device/net, sorted */
  size_t nnetdevs;
  doctor_port *ports; /* ascending port number */
  size_t nports;
} doctor_hca;

typedef struct doctor_addr {
  int family;       /* AF_INET or AF_INET6 */
  uint8_t addr[16]; /* 4 or 16 bytes used */
  int prefix;       /* prefix length */
} doctor_addr;

typedef struct doctor_iface {
  char name[DOCTOR_NAME_MAX];
  int mtu;            /* -1 when unknown */
  char operstate[16]; /* "up", "down", "unknown", "" when unreadable */
  doctor_addr *addrs;
  size_t naddrs;
} doctor_iface;

#define DOCTOR_MAX_GPUS 64

typedef struct doctor_gpu {
  char pci[32];   /* "0000:3b:00.0", "" when unknown */
  char uuid[64];  /* "GPU-...", "" when unknown */
  int numa;       /* its NUMA node (-1, unknown, reads as 0, as the binding does) */
  char cpus[256]; /* that node's CPUs, "0-15" ("" when the CPUs could not be read) */
} doctor_gpu;

typedef struct doctor_facts {
  doctor_hca *hcas; /* sorted by name, numbers compared as numbers (mlx5_2 < mlx5_10) */
  size_t nhcas;
  doctor_iface *ifaces; /* sorted the same way */
  size_t nifaces;

  char master[256];                    /* cfg->master, "" when none */
  char master_addr[64];                /* its numeric address, "" when not resolved */
  char master_error[160];              /* why the master could not be resolved/routed */
  char route_iface[DOCTOR_NAME_MAX];   /* interface that reaches the master, "" */
  char default_iface[DOCTOR_NAME_MAX]; /* interface of the default route, "" */

  int memlock_known;      /* 1 when the locked-memory limit was read */
  int memlock_unlimited;  /* soft limit is unlimited */
  uint64_t memlock_bytes; /* soft limit when limited */
  int shm_known;          /* 1 when DEV_ROOT/shm could be measured */
  uint64_t shm_bytes;     /* total size of the file system at DEV_ROOT/shm */
  int dev_infiniband;     /* DEV_ROOT/infiniband is a directory */
  int uverbs_count;       /* uverbs* entries in it */
  int hugepages_known;
  long hugepages_total; /* HugePages_Total of PROC_ROOT/meminfo */
  long hugepage_kb;     /* Hugepagesize */
  int mem_total_known;
  uint64_t mem_total_bytes; /* MemTotal of PROC_ROOT/meminfo */

  int nccl_probed; /* 0 when nccl_if_needed skipped the search: the fields below say nothing */
  int nccl_found;
  int nccl_major, nccl_minor, nccl_patch; /* -1 when the version could not be told */
  char nccl_path[512];                    /* the file the version came from */

  /* GPUs as `cohort run --nproc-per-node gpu` and `--numa-binding` see them
   * (src/doctor/topo.h, read under the same roots and environment). */
  char gpu_vendor[8]; /* "nvidia", "amd", "" when none was found */
  int gpus_found;     /* present, visible or not */
  size_t ngpus;       /* visible, in visible order */
  doctor_gpu gpus[DOCTOR_MAX_GPUS];
  char gpu_visible_var[24]; /* CUDA_VISIBLE_DEVICES (or HIP_) when it chose them, "" */
  char driver[64];          /* NVIDIA: PROC/driver/nvidia/version's version, "" unknown */
  /* The CUDA driver library the loader would take: the first libcuda.so.1 in
   * LD_LIBRARY_PATH, then the system's library directories (under the lib
   * root); its version is the name of the file the link resolves to
   * (libcuda.so.580.159.04). NVIDIA only; "" when not found / not told. */
  char cuda_lib[512];
  char cuda_lib_version[64];

  char **notes; /* things the probe could not read that matter, one line each */
  size_t nnotes;
} doctor_facts;

typedef struct doctor_var {
  char *name;
  char *value;
  char *reason;     /* one line */
  char *user_value; /* in result->kept only: the value the user set, which stays */
} doctor_var;

typedef struct doctor_summary {
  char link[16]; /* "infiniband", "ethernet", "mixed" or "none" (no active RDMA port) */
  char hca[512]; /* active ports "dev:port,..." in order, "" when none */
  int gid_index; /* the RoCE GID index derived, -1 when none (IB, TCP, or none qualified) */
} doctor_summary;

/*
 * `cohort doctor --check`: a verdict per check (docs/doctor.md lists them
 * and why). FAIL means the node as found cannot run a job as configured
 * (CUDA, NCCL or RDMA would fail or silently fall back to TCP); WARN that it
 * runs slower than it could; N/A that the check does not apply here.
 */
typedef enum doctor_check_status {
  DOCTOR_CHECK_OK = 0,
  DOCTOR_CHECK_NA,
  DOCTOR_CHECK_WARN,
  DOCTOR_CHECK_FAIL,
} doctor_check_status;

typedef struct doctor_check {
  const char *name; /* static: "gpu-driver", "nccl-library", ... */
  doctor_check_status status;
  char *detail; /* one line: what was found, and for WARN/FAIL what it breaks */
} doctor_check;

typedef struct doctor_result {
  doctor_var *set; /* to add to the environment; no name here is set in envp */
  size_t nset;
  doctor_var *kept; /* derived but already set by the user: value is what doctor
                       would have set, reason says why; the user's value stays */
  size_t nkept;
  char **notes; /* information (e.g. the installed NCCL picks the GID itself) */
  size_t nnotes;
  char **warnings; /* the job may run but slowly or fragilely */
  size_t nwarnings;
  char **errors; /* what was asked cannot be derived (e.g. RoCE with no usable GID) */
  size_t nerrors;
  doctor_check *checks; /* every check, in the order docs/doctor.md lists them */
  size_t nchecks;
  doctor_summary summary;
  doctor_facts *facts; /* owned by the result when it came from doctor_plan(), else NULL */
} doctor_result;

/* Reads the machine described by cfg (cfg may be NULL for all defaults). */
int doctor_probe(const doctor_config *cfg, char **envp, doctor_facts **out);
void doctor_facts_destroy(doctor_facts *facts);

/*
 * Derives the settings from facts. envp (NULL-terminated "NAME=value"
 * strings, may be NULL) is the environment the job will get: a variable set
 * there is never in result->set (it goes to result->kept). The user's
 * NCCL_IB_HCA narrows the ports considered (NCCL's syntax: prefixes, "="
 * exact, "^" exclude); the user's NCCL_IB_GID_INDEX is checked against the
 * GID table and becomes summary.gid_index. Only cfg->set_gid_index is used
 * from cfg. facts is not modified.
 */
int doctor_derive(const doctor_facts *facts, const doctor_config *cfg, char **envp,
                  doctor_result **out);

/* doctor_probe() + doctor_derive(); result->facts holds the facts. */
int doctor_plan(const doctor_config *cfg, char **envp, doctor_result **out);
void doctor_result_destroy(doctor_result *result);

/* The value of a variable in result->set, or NULL. */
const char *doctor_result_get(const doctor_result *result, const char *name);

/*
 * The summary as one line without spaces, e.g.
 * "link=ethernet;hca=mlx5_bond_0:1;gid=3" ("gid=none" when -1). Returns 0 or
 * -ENOSPC when len is too small (DOCTOR_SUMMARY_MAX always suffices).
 */
int doctor_summary_format(const doctor_summary *s, char *buf, size_t len);
/* Parses doctor_summary_format() output. -EINVAL for anything else. */
int doctor_summary_parse(const char *text, doctor_summary *out);
/*
 * Compares the summaries of two nodes. Returns 0 when they agree, 1 when
 * they differ (then warning holds one line naming both nodes and each
 * difference, e.g. "nodes node0 and node3 differ: HCA set mlx5_0:1,mlx5_1:1
 * vs mlx5_0:1; GID index 3 vs 5"), or -EINVAL for NULL arguments.
 */
int doctor_summary_compare(const char *name_a, const doctor_summary *a, const char *name_b,
                           const doctor_summary *b, char *warning, size_t len);

/*
 * Renderings of a result (which must hold facts for the report and JSON,
 * i.e. come from doctor_plan() or have result->facts set by the caller).
 * Each returns 0 and a malloc'd NUL-terminated string in *out, or -ENOMEM.
 *   report: readable text for a person.
 *   export: "export NAME='value'" lines (single-quoted, quotes escaped), each
 *           after a "# reason" comment; only result->set.
 *   json:   the document described by docs/doctor.schema.json.
 */
int doctor_format_report(const doctor_result *result, char **out);
int doctor_format_export(const doctor_result *result, char **out);
int doctor_format_json(const doctor_result *result, char **out);
/*
 *   checks: one line per check, "STATUS  NAME  detail" (STATUS as
 *           doctor_check_status_name() gives it), then a count line.
 */
int doctor_format_checks(const doctor_result *result, char **out);
/* The number of checks of result whose status is DOCTOR_CHECK_FAIL. */
size_t doctor_checks_failed(const doctor_result *result);

/* Text of a link layer / GID type as the report and JSON print them. */
const char *doctor_link_name(doctor_link link);
const char *doctor_gid_type_name(doctor_gid_type type);
/* "ok", "n/a", "warn" or "fail". */
const char *doctor_check_status_name(doctor_check_status status);

#endif
