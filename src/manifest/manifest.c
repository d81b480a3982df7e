/* manifest.c - the quoting and checks of every template; the Slurm and docker
 * templates (Kubernetes' are in k8s.c). */
#include "manifest/manifest.h"
#include "manifest/internal.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/net.h"

/* ---- quoting ---- */

/*
 * Decodes one UTF-8 sequence at s (strict: no overlong forms, surrogates or
 * values above U+10FFFF). Returns its length and the code point, or 0.
 */
static size_t utf8_decode(const unsigned char *s, uint32_t *cp) {
  if (s[0] < 0x80) {
    *cp = s[0];
    return 1;
  }
  size_t n;
  uint32_t v, min;
  if ((s[0] & 0xE0) == 0xC0) {
    n = 2, v = s[0] & 0x1F, min = 0x80;
  } else if ((s[0] & 0xF0) == 0xE0) {
    n = 3, v = s[0] & 0x0F, min = 0x800;
  } else if ((s[0] & 0xF8) == 0xF0) {
    n = 4, v = s[0] & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  for (size_t i = 1; i < n; i++) {
    if ((s[i] & 0xC0) != 0x80) return 0; /* also stops at the terminating NUL */
    v = (v << 6) | (s[i] & 0x3F);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return n;
}

/* Code points a YAML double-quoted scalar may hold literally. Line and
 * paragraph separators (U+0085, U+2028, U+2029) are printable but would be
 * folded as line breaks, and U+FEFF is a byte order mark: escape those too. */
static int yaml_literal_ok(uint32_t c) {
  if (c >= 0x20 && c <= 0x7E) return 1;
  if (c == 0x85 || c == 0x2028 || c == 0x2029 || c == 0xFEFF) return 0;
  return (c >= 0xA0 && c <= 0xD7FF) || (c >= 0xE000 && c <= 0xFFFD) ||
         (c >= 0x10000 && c <= 0x10FFFF);
}

int manifest_yaml_quote(base_buf *b, const char *s, int dollar_escape) {
  const unsigned char *p = (const unsigned char *)s;
  for (const unsigned char *q = p; *q;) {
    uint32_t cp;
    size_t n = utf8_decode(q, &cp);
    if (n == 0) return -EINVAL;
    q += n;
  }
  base_buf_putn(b, "\"", 1);
  while (*p) {
    uint32_t c = 0; /* valid UTF-8 (checked above), but -O3 cannot see that utf8_decode sets it */
    size_t n = utf8_decode(p, &c);
    switch (c) {
    case '"':
      base_buf_puts(b, "\\\"");
      break;
    case '\\':
      base_buf_puts(b, "\\\\");
      break;
    case '\n':
      base_buf_puts(b, "\\n");
      break;
    case '\t':
      base_buf_puts(b, "\\t");
      break;
    case '\r':
      base_buf_puts(b, "\\r");
      break;
    case '$':
      base_buf_puts(b, dollar_escape ? "$$" : "$");
      break;
    default:
      if (yaml_literal_ok(c))
        base_buf_putn(b, (const char *)p, n);
      else if (c <= 0xFF)
        base_buf_printf(b, "\\x%02X", (unsigned)c);
      else if (c <= 0xFFFF)
        base_buf_printf(b, "\\u%04X", (unsigned)c);
      else
        base_buf_printf(b, "\\U%08X", (unsigned)c);
    }
    p += n;
  }
  base_buf_putn(b, "\"", 1);
  return 0;
}

static int shell_safe_char(unsigned char c) {
  return isalnum(c) || strchr("_@%+=:,./-", c) != NULL;
}

void manifest_shell_quote(base_buf *b, const char *s) {
  int safe = *s != '\0';
  for (const unsigned char *p = (const unsigned char *)s; *p && safe; p++)
    safe = shell_safe_char(*p);
  if (safe) {
    base_buf_puts(b, s);
    return;
  }
  /* Inside single quotes nothing is special; a quote is closed, escaped and
   * reopened. */
  base_buf_putn(b, "'", 1);
  for (const char *p = s; *p; p++) {
    if (*p == '\'')
      base_buf_puts(b, "'\\''");
    else
      base_buf_putn(b, p, 1);
  }
  base_buf_putn(b, "'", 1);
}

/* ---- validation ---- */

int manifest_parse_size(const char *s, uint64_t *bytes) {
  if (s == NULL || !isdigit((unsigned char)*s)) return -EINVAL;
  uint64_t v = 0;
  const char *p = s;
  for (; isdigit((unsigned char)*p); p++) {
    unsigned d = (unsigned)(*p - '0');
    if (v > (UINT64_MAX - d) / 10) return -ERANGE;
    v = v * 10 + d;
  }
  unsigned shift = 0;
  switch (*p) {
  case '\0':
    break;
  case 'k':
  case 'K':
    shift = 10;
    break;
  case 'm':
  case 'M':
    shift = 20;
    break;
  case 'g':
  case 'G':
    shift = 30;
    break;
  case 't':
  case 'T':
    shift = 40;
    break;
  default:
    return -EINVAL;
  }
  if (shift) {
    p++;
    if (*p == 'i') p++;
    if (*p == 'B' || *p == 'b') p++;
  }
  if (*p != '\0') return -EINVAL;
  if (v == 0) return -EINVAL;
  if (shift && v > (UINT64_MAX >> shift)) return -ERANGE;
  *bytes = v << shift;
  return 0;
}

int manifest_seterr(char *err, size_t errlen, const char *fmt, ...) {
  if (errlen > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return -EINVAL;
}

/* RFC 1123 label as Kubernetes checks it for Service names. */
int manifest_dns_label_ok(const char *s, size_t maxlen) {
  size_t n = strlen(s);
  if (n == 0 || n > maxlen) return 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return 0;
  }
  return s[0] != '-' && s[n - 1] != '-';
}

/* RFC 1123 subdomain, as Kubernetes checks it for Secret names. */
int manifest_dns_subdomain_ok(const char *s) {
  size_t n = strlen(s);
  if (n == 0 || n > 253) return 0;
  char label[254];
  memcpy(label, s, n + 1);
  for (char *save = NULL, *tok = strtok_r(label, ".", &save); tok != NULL;
       tok = strtok_r(NULL, ".", &save))
    if (!manifest_dns_label_ok(tok, 63)) return 0;
  return s[0] != '.' && s[n - 1] != '.' && strstr(s, "..") == NULL;
}

/* Image references, host names and similar: printable ASCII, no spaces. */
int manifest_token_ok(const char *s) {
  if (s == NULL || *s == '\0') return 0;
  for (const unsigned char *p = (const unsigned char *)s; *p; p++)
    if (*p <= 0x20 || *p >= 0x7F) return 0;
  return 1;
}

int manifest_common_checks(int nodes, int nproc, char *const *cmd, size_t ncmd, char *err,
                           size_t errlen) {
  if (nodes < 1 || nodes > MANIFEST_MAX_NODES)
    return manifest_seterr(err, errlen, "--nodes must be in 1..%d", MANIFEST_MAX_NODES);
  if (nproc < 1 || nproc > MANIFEST_MAX_NPROC)
    return manifest_seterr(err, errlen, "--nproc-per-node must be in 1..%d", MANIFEST_MAX_NPROC);
  if (cmd == NULL || ncmd == 0)
    return manifest_seterr(err, errlen, "no command: give the training command after '--'");
  for (size_t i = 0; i < ncmd; i++) {
    base_buf tmp;
    base_buf_init(&tmp);
    int rc = manifest_yaml_quote(&tmp, cmd[i], 0);
    base_buf_free(&tmp);
    if (rc != 0)
      return manifest_seterr(err, errlen, "command argument %zu is not valid UTF-8", i + 1);
  }
  return 0;
}

/* Formats a byte count with the largest binary unit that divides it. */
void manifest_size_str(uint64_t bytes, const char *const units[4], char *out, size_t outlen) {
  static const unsigned shifts[4] = {40, 30, 20, 10};
  for (int i = 0; i < 4; i++) {
    uint64_t unit = (uint64_t)1 << shifts[i];
    if (bytes % unit == 0) {
      snprintf(out, outlen, "%llu%s", (unsigned long long)(bytes / unit), units[i]);
      return;
    }
  }
  snprintf(out, outlen, "%llu", (unsigned long long)bytes);
}

int manifest_finish(base_buf *out, char *err, size_t errlen) {
  if (out->oom) {
    manifest_seterr(err, errlen, "out of memory");
    return -ENOMEM;
  }
  return 0;
}

/* ---- Slurm ---- */

/* Slurm time limits: "M", "M:S", "H:M:S", "D-H", "D-H:M", "D-H:M:S". */
static int slurm_time_ok(const char *s) {
  if (strcmp(s, "UNLIMITED") == 0 || strcmp(s, "infinite") == 0) return 1;
  const char *p = s;
  int days = 0, fields = 0;
  while (*p) {
    if (!isdigit((unsigned char)*p)) return 0;
    while (isdigit((unsigned char)*p)) p++;
    fields++;
    if (*p == '-') {
      if (days || fields != 1) return 0;
      days = 1;
      fields = 0;
      p++;
      if (*p == '\0') return 0;
    } else if (*p == ':') {
      p++;
      if (*p == '\0') return 0;
    } else if (*p != '\0') {
      return 0;
    }
  }
  return fields >= 1 && fields <= 3;
}

/* Names on #SBATCH lines, which sbatch splits at white space. */
static int slurm_name_ok(const char *s, const char *extra) {
  if (s == NULL || *s == '\0' || strlen(s) > 200) return 0;
  for (const unsigned char *p = (const unsigned char *)s; *p; p++)
    if (!isalnum(*p) && strchr(extra, *p) == NULL) return 0;
  return 1;
}

int manifest_slurm(const manifest_slurm_opts *o, base_buf *out, char *err, size_t errlen) {
  int rc = manifest_common_checks(o->nodes, o->nproc_per_node, o->cmd, o->ncmd, err, errlen);
  if (rc != 0) return rc;
  if (o->gpus_per_node < 0 || o->gpus_per_node > MANIFEST_MAX_NPROC)
    return manifest_seterr(err, errlen, "--gpus-per-node must be in 0..%d", MANIFEST_MAX_NPROC);
  if (o->time != NULL && !slurm_time_ok(o->time))
    return manifest_seterr(err, errlen,
                           "--time '%s' is not a Slurm time (M, M:S, H:M:S, D-H, D-H:M or D-H:M:S)",
                           o->time);
  if (o->partition != NULL && !slurm_name_ok(o->partition, "_.-,"))
    return manifest_seterr(err, errlen, "--partition '%s' must be letters, digits and _ . - ,",
                           o->partition);
  if (o->job_name != NULL && !slurm_name_ok(o->job_name, "_.-"))
    return manifest_seterr(err, errlen, "--job-name '%s' must be letters, digits and _ . -",
                           o->job_name);

  base_buf *b = out;
  base_buf_puts(b, "#!/bin/bash\n");
  if (o->job_name) base_buf_printf(b, "#SBATCH --job-name=%s\n", o->job_name);
  base_buf_printf(b, "#SBATCH --nodes=%d\n#SBATCH --ntasks-per-node=1\n", o->nodes);
  if (o->gpus_per_node > 0) base_buf_printf(b, "#SBATCH --gpus-per-node=%d\n", o->gpus_per_node);
  if (o->time) base_buf_printf(b, "#SBATCH --time=%s\n", o->time);
  if (o->partition) base_buf_printf(b, "#SBATCH --partition=%s\n", o->partition);
  base_buf_puts(b, "#\n"
                   "# Generated by `cohort manifest slurm`. Submit with: sbatch FILE\n"
                   "# srun starts one `cohort run` agent per node; the agents find each other\n"
                   "# from Slurm's environment (SLURM_JOB_NODELIST, SLURM_NODEID, SLURM_NNODES).\n"
                   "# --kill-on-bad-exit ends every node when one fails.\n"
                   "set -euo pipefail\n"
                   "# The job's token authenticates every agent to the job's store: the one\n"
                   "# exported before sbatch, or a fresh one made here, which srun passes to\n"
                   "# every node and nothing outside the job knows.\n"
                   "if [ -z \"${COHORT_TOKEN:-}\" ]; then\n"
                   "  COHORT_TOKEN=$(cohort token)\n"
                   "  export COHORT_TOKEN\n"
                   "fi\n");
  base_buf_printf(b,
                  "srun --nodes=%d --ntasks-per-node=1 --kill-on-bad-exit=1 cohort run "
                  "--nproc-per-node %d",
                  o->nodes, o->nproc_per_node);
  if (o->hang_timeout > 0) base_buf_printf(b, " --hang-timeout %d", o->hang_timeout);
  base_buf_puts(b, " --");
  for (size_t i = 0; i < o->ncmd; i++) {
    base_buf_puts(b, " ");
    manifest_shell_quote(b, o->cmd[i]);
  }
  base_buf_puts(b, "\n");
  return manifest_finish(out, err, errlen);
}

/* ---- docker ---- */

/* The command that writes the job's token into the env file every line reads. */
static void docker_env_file(base_buf *b, const char *token) {
  base_buf_puts(b, "# Every line reads the job's token, generated with this file, from "
                   "the env file\n"
                   "# " MANIFEST_DOCKER_ENV ", not from docker's command line, where ps "
                   "would show it.\n"
                   "# Run the next line once (printf is built into the shell), then copy "
                   "the file\n"
                   "# beside these lines on every node (e.g. with scp) and keep it private: "
                   "whoever\n"
                   "# has the token can join or stop the job.\n"
                   "(umask 077 && printf 'COHORT_TOKEN=%s\\n' ");
  manifest_shell_quote(b, token);
  base_buf_puts(b, " > " MANIFEST_DOCKER_ENV ")\n");
}

int manifest_docker(const manifest_docker_opts *o, base_buf *out, char *err, size_t errlen) {
  int rc = manifest_common_checks(o->nodes, o->nproc_per_node, o->cmd, o->ncmd, err, errlen);
  if (rc != 0) return rc;
  if (!manifest_token_ok(o->image))
    return manifest_seterr(err, errlen, "--image must be a non-empty image reference");
  if (o->master_addr == NULL) return manifest_seterr(err, errlen, "--master-addr is required");
  if (!manifest_token_ok(o->master_addr) || strlen(o->master_addr) >= BASE_HOST_MAX ||
      strspn(o->master_addr,
             "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-:_") !=
          strlen(o->master_addr))
    return manifest_seterr(err, errlen, "--master-addr '%s' must be a host name or an IP address",
                           o->master_addr);
  if (o->port < 1 || o->port > 65535)
    return manifest_seterr(err, errlen, "--port must be in 1..65535");
  if (o->gpus != NULL && !manifest_token_ok(o->gpus))
    return manifest_seterr(err, errlen, "--gpus must be a docker --gpus value such as all or 2");
  /* An env file holds one line per variable, taken as is. */
  if (!manifest_token_ok(o->token))
    return manifest_seterr(err, errlen, "no job token for the env file");

  char master[BASE_HOST_MAX + 16];
  base_join_hostport(o->master_addr, o->port, master, sizeof master);
  char shm[32] = "";
  if (o->shm_bytes > 0) {
    static const char *const units[4] = {"t", "g", "m", "k"};
    manifest_size_str(o->shm_bytes, units, shm, sizeof shm);
    if (shm[strlen(shm) - 1] == 't') /* docker knows no "t" */
      snprintf(shm, sizeof shm, "%llug", (unsigned long long)(o->shm_bytes >> 30));
  }

  base_buf *b = out;
  base_buf_printf(b,
                  "# Generated by `cohort manifest docker`: run line i on node i; node 0 is "
                  "%s, whose\n"
                  "# agent hosts the rendezvous on port %d.\n",
                  o->master_addr, o->port);
  docker_env_file(b, o->token);
  for (int node = 0; node < o->nodes; node++) {
    base_buf_printf(b, "# node %d\n", node);
    base_buf_puts(b, "docker run --rm --network host --ulimit memlock=-1:-1");
    /* The host's IPC namespace brings the host's /dev/shm; docker ignores
     * --shm-size beside --ipc host (and podman refuses the pair), so a
     * size means a private IPC namespace with a /dev/shm of that size. */
    if (shm[0])
      base_buf_printf(b, " --shm-size %s", shm);
    else
      base_buf_puts(b, " --ipc host");
    if (o->gpus) {
      base_buf_puts(b, " --gpus ");
      manifest_shell_quote(b, o->gpus);
    }
    if (o->rdma) base_buf_puts(b, " --device /dev/infiniband --cap-add IPC_LOCK");
    base_buf_puts(b, " --env-file " MANIFEST_DOCKER_ENV " ");
    manifest_shell_quote(b, o->image);
    base_buf_printf(b, " cohort run --nnodes %d --node-rank %d --master ", o->nodes, node);
    manifest_shell_quote(b, master);
    base_buf_printf(b, " --nproc-per-node %d", o->nproc_per_node);
    if (o->hang_timeout > 0) base_buf_printf(b, " --hang-timeout %d", o->hang_timeout);
    base_buf_puts(b, " --");
    for (size_t i = 0; i < o->ncmd; i++) {
      base_buf_puts(b, " ");
      manifest_shell_quote(b, o->cmd[i]);
    }
    base_buf_puts(b, "\n");
  }
  return manifest_finish(out, err, errlen);
}
