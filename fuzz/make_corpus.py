#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (fuzz/corpus/<target>/).

The seeds are small valid (and a few nearly valid) inputs in each target's
input format, described at the top of its fuzz/fuzz_<name>.c, so that the
fuzzer starts from the interesting parts of each format. Rerun after a format
changes; the output is deterministic.
  fuzz/make_corpus.py [REPO_ROOT]
"""
import os
import struct
import sys
import hashlib
import hmac

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
corpus = os.path.join(root, "fuzz", "corpus")


def put(target, name, data):
    d = os.path.join(corpus, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- the store protocol ----
def frame(body):
    return struct.pack(">I", len(body)) + body


def key(k):
    k = k.encode()
    return struct.pack(">H", len(k)) + k


def value(v):
    v = v.encode() if isinstance(v, str) else v
    return struct.pack(">I", len(v)) + v


NONCE = bytes(range(32))
HELLO = frame(b"\x01\x01" + NONCE)
PING = frame(b"\x10")


def SET(k, v):
    return frame(b"\x11" + key(k) + value(v))


def GET(k):
    return frame(b"\x12" + key(k))


def ADD(k, d):
    return frame(b"\x13" + key(k) + struct.pack(">q", d))


def CAS(k, exp, des):
    b = b"\x14" + key(k)
    b += b"\x00" if exp is None else b"\x01" + value(exp)
    return frame(b + value(des))


def DELETE(k):
    return frame(b"\x15" + key(k))


def WAIT(ms, keys):
    return frame(b"\x16" + struct.pack(">II", ms, len(keys)) + b"".join(key(k) for k in keys))


AUTH_BAD = frame(b"\x02\x20" + b"\xaa" * 32)
AUTH_NONE = frame(b"\x02\x00")

session = HELLO + PING + SET("k", "v") + GET("k") + ADD("c", 5) + ADD("c", -2) + GET("c") + \
    CAS("k", "v", "w") + CAS("n", None, "x") + WAIT(0, ["k", "c"]) + DELETE("k") + GET("k") + \
    WAIT(50, ["missing"]) + DELETE("k")
put("fuzz_store_session", "session", b"\x00" + session)
put("fuzz_store_session", "pipelined_small", b"\x00" + HELLO + SET("a", "1") * 3 + GET("a"))
put("fuzz_store_session", "add_not_number", b"\x00" + HELLO + SET("x", "abc") + ADD("x", 1) +
    ADD("m", 2**63 - 1) + ADD("m", 1))
put("fuzz_store_session", "no_hello", b"\x00" + SET("k", "v"))
put("fuzz_store_session", "repeated_hello", b"\x00" + HELLO + HELLO)
put("fuzz_store_session", "bad_version", b"\x00" + frame(b"\x01\x07" + NONCE))
put("fuzz_store_session", "zero_length", b"\x00" + HELLO + b"\x00\x00\x00\x00")
put("fuzz_store_session", "huge_length", b"\x00" + HELLO + b"\xff\xff\xff\xf0" + b"x" * 8)
put("fuzz_store_session", "partial", b"\x00" + HELLO + SET("k", "v")[:-1])
put("fuzz_store_session", "token_bad_mac", b"\x01" + HELLO + AUTH_BAD + SET("k", "v") +
    GET("secret"))
put("fuzz_store_session", "token_no_mac", b"\x01" + HELLO + AUTH_NONE + GET("secret"))
put("fuzz_store_session", "token_skip_auth", b"\x01" + HELLO + SET("key", "v"))
a = HELLO + WAIT(2000, ["k", "x"]) + GET("k")
b = HELLO + SET("k", "1") + SET("x", "2")
put("fuzz_store_session", "two_wait_set", b"\x02" + bytes([len(a) * 256 // (len(a) + len(b)) + 1])
    + a + b)
put("fuzz_store_proto", "requests", b"\x00" + session)
put("fuzz_store_proto", "hello_response", b"\x01\x01" + b"\x00\x01\x01" + NONCE)
put("fuzz_store_proto", "get_response", b"\x01\x12" + b"\x00" + value("hello"))
put("fuzz_store_proto", "cas_response", b"\x01\x14" + b"\x00\x01" + value("w"))

# ---- multicast datagrams ----
def dgram(kind, node_id, rank, job, host, port, token=None):
    body = b"CHRV" + bytes([1, kind, 1 if token else 0, len(job)]) + struct.pack(
        ">QiH", node_id, rank, port) + bytes([len(host), 0]) + job.encode() + host.encode()
    if token:
        body += hmac.new(token.encode(), body, hashlib.sha256).digest()
    return body


put("fuzz_mcast_dgram", "announce", b"\x00" + dgram(1, 42, 0, "job-1", "10.0.0.1", 29400))
put("fuzz_mcast_dgram", "announce_nohost", b"\x00" + dgram(1, 7, -1, "j", "", 1234))
put("fuzz_mcast_dgram", "candidate", b"\x00" + dgram(2, 99, 3, "train_42", "", 0))
# Signed by the harness (bits 0 and 1): the body only.
put("fuzz_mcast_dgram", "announce_signed", b"\x03" + dgram(1, 42, 0, "job-1", "node0", 29400))
put("fuzz_mcast_dgram", "candidate_signed", b"\x03" + dgram(2, 5, -1, "job-1", "", 0))
put("fuzz_mcast_dgram", "mac_no_token", b"\x00" + dgram(1, 1, 0, "j", "h", 1, token="x"))

# ---- rendezvous round ----
# The head, a NUL and page 0 (the joiner is the first to join: its line has seq 1).
plan = "ok nnodes=2 master=10.0.0.1 port=29501 world=6\n0 00000000000000aa 4 10.0.0.1 node0\n" \
       "\0" "1 1 4 00000000000000bb 2 10.0.0.2 node1\n2 0 0 00000000000000aa 4 10.0.0.1 node0\n"
put("fuzz_rdzv_plan", "plan", b"\x00" + plan.encode())
put("fuzz_rdzv_plan", "plan_head_only", b"\x00" + plan.split("\0")[0].encode())
put("fuzz_rdzv_plan", "plan_error", b"\x00" + b"error nodes a and b both claim node rank 1")
put("fuzz_rdzv_plan", "plan_short", b"\x00" + b"ok nnodes=3 master=h port=1 world=3\n0 1 1 a b\n")


def record(uid, claim, nproc, host, hostname, sees):
    return "uid=%016x claim=%d nproc=%d host=%s hostname=%s sees=%s" % (uid, claim, nproc, host,
                                                                          hostname, sees)


recs = [record(1, -1, 2, "10.0.0.2", "node1", "10.0.0.1"),
        record(2, 2, 1, "10.0.0.3", "node2", "10.0.0.1")]
put("fuzz_rdzv_plan", "records", b"\x01" + "\0".join(recs).encode())
put("fuzz_rdzv_plan", "records_conflict", b"\x01" + "\0".join(
    [record(1, 1, 2, "a", "n1", "m"), record(2, 1, 2, "b", "n2", "m")]).encode())
put("fuzz_rdzv_plan", "records_other_host", b"\x01" + record(3, 0, 1, "c", "n3", "-").encode())
put("fuzz_rdzv_plan", "assign", b"\x02" + bytes([1, 0xff, 0, 3, 0xff, 2]))
# A re-form round: node 0 was node 0 (prev 0) and takes part; a survivor that was node 2, one
# that was node 1, a new node; then one node that cannot take part (the plan says restart).
reform = [record(1, -1, 2, "10.0.0.2", "node2", "10.0.0.1") + " prev=2 part=1",
          record(2, -1, 2, "10.0.0.3", "node1", "10.0.0.1") + " prev=1 part=1",
          record(3, -1, 2, "10.0.0.4", "node3", "10.0.0.1") + " prev=-1 part=1"]
put("fuzz_rdzv_plan", "records_reform", b"\x03\x01" + "\0".join(reform).encode())
put("fuzz_rdzv_plan", "records_reform_restart", b"\x03\x01" + "\0".join(
    reform[:1] + [record(4, -1, 1, "10.0.0.5", "node4", "10.0.0.1") + " prev=3 part=0"]).encode())

# ---- scheduler environments and the rendezvous file ----
envs = {
    "slurm": "SLURM_JOB_ID=42\nSLURM_NODEID=1\nSLURM_JOB_NODELIST=node[01-04]\n"
             "SLURM_JOB_NUM_NODES=4\nSLURM_STEP_NUM_TASKS=4\n",
    "slurm_step": "SLURM_JOB_ID=7\nSLURM_NODEID=0\nSLURM_STEP_NODELIST=gpu[1-2],cpu3\n"
                  "SLURM_STEP_NUM_NODES=3\nSLURM_JOB_NODELIST=x[1-9]\nMASTER_PORT=29500\n",
    "k8s": "JOB_COMPLETION_INDEX=2\nMASTER_ADDR=job-0.svc\nMASTER_PORT=29400\n",
    "replica": "MASTER_ADDR=10.0.0.1\nMASTER_PORT=23456\nRANK=1\nWORLD_SIZE=2\n",
    "ompi": "OMPI_COMM_WORLD_RANK=3\nOMPI_COMM_WORLD_SIZE=4\nMASTER_ADDR=h\nMASTER_PORT=1\n",
}
for name, text in envs.items():
    put("fuzz_sched_env", name, b"\x00" + text.encode())
put("fuzz_sched_env", "replica_flags", b"\x0e" + envs["replica"].encode())
put("fuzz_sched_env", "file_ready", b"\x01cohort-rdzv 1\njob=j1\nstate=ready\nhost=10.0.0.1\n"
    b"port=29400\n")
put("fuzz_sched_env", "file_claimed", b"\x01cohort-rdzv 1\njob=j1\nstate=claimed\n")

# ---- Slurm hostlists ----
for i, e in enumerate(["node[01-04,07]", "a[1-2]b[3-4]", "x1,y[2-3]", "n[0008-0011]",
                       "gpu-[1-3].cluster", "h[1-100000]", "single"]):
    put("fuzz_hostlist", "expr%d" % i, bytes([255]) + e.encode())

# ---- doctor fixture trees ----
fixtures = os.path.join(root, "tests", "fixtures", "doctor")
for name in sorted(os.listdir(fixtures)):
    top = os.path.join(fixtures, name)
    if not os.path.isdir(top):
        continue
    entries = []
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        for fn in sorted(filenames):
            full = os.path.join(dirpath, fn)
            rel = os.path.relpath(full, top)
            if fn == ".keep":
                continue
            if os.path.islink(full):
                target = os.path.relpath(os.path.realpath(full), os.path.realpath(top))
                entries.append(rel.encode() + b"\n->" + target.encode())
            else:
                with open(full, "rb") as f:
                    entries.append(rel.encode() + b"\n" + f.read())
    put("fuzz_doctor_tree", name, b"\0".join(entries))
put("fuzz_doctor_tree", "env", b"env\nNCCL_IB_HCA=mlx5_0\nNCCL_IB_GID_INDEX=3\0" +
    b"sys/class/net/eth0/mtu\n9000\n")

# A node for the topology probe and the CPU binding: 2 NUMA nodes of 2 cores
# with SMT siblings and an L3 each, 3 NVIDIA GPUs, CUDA_VISIBLE_DEVICES.
topo = [b"sys/devices/system/cpu/online\n0-7\n"]
for c in range(8):
    core, numa = c % 4, (c % 4) // 2
    topo.append(b"sys/devices/system/cpu/cpu%d/topology/physical_package_id\n0\n" % c)
    topo.append(b"sys/devices/system/cpu/cpu%d/topology/thread_siblings_list\n%d,%d\n"
                % (c, core, core + 4))
    topo.append(b"sys/devices/system/cpu/cpu%d/cache/index3/level\n3\n" % c)
    topo.append(b"sys/devices/system/cpu/cpu%d/cache/index3/type\nUnified\n" % c)
    topo.append(b"sys/devices/system/cpu/cpu%d/cache/index3/shared_cpu_list\n%d-%d,%d-%d\n"
                % (c, 2 * numa, 2 * numa + 1, 2 * numa + 4, 2 * numa + 5))
for n in range(2):
    topo.append(b"sys/devices/system/node/node%d/cpulist\n%d-%d,%d-%d\n"
                % (n, 2 * n, 2 * n + 1, 2 * n + 4, 2 * n + 5))
for g in range(3):
    topo.append(b"proc/driver/nvidia/gpus/0000:0%d:00.0/information\nGPU UUID: GPU-%d\n" % (g, g))
    topo.append(b"sys/bus/pci/devices/0000:0%d:00.0/numa_node\n%d\n" % (g, 1 - g % 2))
put("fuzz_doctor_tree", "topology", b"\0".join(topo))
put("fuzz_doctor_tree", "topology_visible", b"\0".join(topo + [b"env\nCUDA_VISIBLE_DEVICES=2,GPU-0,x"]))
put("fuzz_doctor_tree", "amd", b"sys/devices/system/cpu/online\n0-3\n\0"
    b"sys/class/drm/renderD128/device/vendor\n0x1002\n\0"
    b"sys/class/drm/renderD128/device/numa_node\n-1\n\0dev/nvidia0\n")

# ---- gpt2 checkpoints and token data ----
def ckpt_header(nparams, nstate, step=5):
    return b"COHGPT2\0" + struct.pack("<II8i5Q", 1, 88, 17, 4, 1, 1, 4, 0, 1, 1, step, 3, 9,
                                      nparams, nstate)


body = ckpt_header(8, 16) + struct.pack("<24f", *[i * 0.5 for i in range(24)])
good = body + b"\0" * 8 + b"GPT2END\0"
put("fuzz_gpt2_ckpt", "valid_fixed", b"\x03" + good)
put("fuzz_gpt2_ckpt", "with_older", b"\x07" + good)
put("fuzz_gpt2_ckpt", "damaged_with_older", b"\x04" + good[:-3])
put("fuzz_gpt2_ckpt", "other_config", b"\x07" + ckpt_header(4, 8) + b"\0" * 48 + b"\0" * 8 +
    b"GPT2END\0")


def shard(tokens):
    h = struct.pack("<3i", 20240520, 1, len(tokens)) + b"\0" * (256 * 4 - 12)
    return h + struct.pack("<%dH" % len(tokens), *tokens)


put("fuzz_gpt2_data", "shard", bytes([1, 0, 7]) + shard(list(range(16)) * 2))
put("fuzz_gpt2_data", "shard_big_vocab", bytes([1 | (0 << 2), 0, 35]) + shard([50000, 1, 2, 3] * 8))
put("fuzz_gpt2_data", "text", bytes([4, 0, 3]) + b"hello world, this is text for tokens\n" * 2)
put("fuzz_gpt2_data", "two_shards", bytes([3, 128, 2]) + shard([1, 2, 3, 4, 5]) +
    shard([6, 7, 8, 9, 10, 11]))
put("fuzz_gpt2_data", "bad_version", bytes([1, 0, 1]) + struct.pack("<3i", 20240520, 2, 0) +
    b"\0" * 1012)

# ---- command lines ----
def argv(*a):
    return b"\x00" + b"\0".join(x.encode() for x in a)


put("fuzz_cli", "k8s", argv("k8s", "--name", "job", "--nodes", "2", "--nproc-per-node", "4",
                            "--image", "repo/img:1", "--gpus", "4", "--rdma", "auto", "--shm",
                            "8Gi", "--", "python", "train.py", "--lr=$LR"))
put("fuzz_cli", "slurm", argv("slurm", "--nodes", "4", "--nproc-per-node", "8", "--time",
                              "1-00:00:00", "--partition", "gpu", "--job-name", "x y", "--",
                              "python", "it's.py"))
put("fuzz_cli", "docker", argv("docker", "--nodes", "2", "--nproc-per-node", "1", "--image", "i",
                               "--master-addr", "10.0.0.1", "--port", "29400", "--rdma", "--",
                               "sh", "-c", "echo $HOME"))
put("fuzz_cli", "bad", argv("k8s", "--nodes", "0", "--", "x"))
for kind in ("jobset", "trainjob", "pytorchjob"):
    put("fuzz_cli", kind, argv(kind, "--name", "j", "--nodes", "3", "--nproc-per-node", "2",
                               "--image", "img", "--gpus", "2", "--rdma", "roce", "--shm", "1G",
                               "--metrics-port", "9400", "--hang-timeout", "60", "--", "python3",
                               "t.py", "$(X)"))
put("fuzz_cli", "run_metrics", b"\x02" + b"\0".join(
    x.encode() for x in ("--metrics-port", "9400", "--metrics-file", "/tmp/m.prom",
                         "--termination-log", "/dev/termination-log", "--", "x")))


def run_argv(*a):
    return b"\x02" + b"\0".join(x.encode() for x in a)


put("fuzz_cli", "run_multinode", run_argv("--nnodes", "2:4", "--node-rank", "1", "--master",
                                          "[::1]:29400", "--nproc-per-node=8", "--max-restarts",
                                          "3", "--", "python", "train.py"))
put("fuzz_cli", "run_mcast", run_argv("--discover", "mcast", "--job", "j-1", "--iface", "eth0",
                                      "--mcast-group", "239.1.2.3:29500", "--heartbeat-timeout",
                                      "2.5", "--tee", "3", "--", "true"))
put("fuzz_cli", "run_file", run_argv("--rdzv-file", "/shared/r", "--join-timeout", "60",
                                     "--last-call", "0", "--grace", "1.5", "--net", "off",
                                     "--token", "s3cr3t", "--log-dir", "/tmp/l", "--", "x"))
put("fuzz_cli", "run_bad", run_argv("--nnodes", "4:2", "--", "x"))
# torchrun's spellings and the --opt=value form (rows of the option table).
put("fuzz_cli", "run_aliases", run_argv("--nproc_per_node=2", "--node_rank=0", "--max_restarts",
                                        "1", "--run_id=job-1", "--log_dir=/tmp/l", "--role=r",
                                        "--", "python", "-u", "train.py"))
# torchrun's command lines: the seeds' (Run:ai static, GreenNode c10d), PyTorch's elastic form,
# the program through Python (-m, --run-path, a script with option-like arguments), notes and
# refusals.
put("fuzz_cli", "run_torchrun_static", run_argv("--nproc-per-node", "4", "--nnodes", "3",
                                                "--node_rank", "1", "--master_addr", "10.0.0.1",
                                                "--master_port", "23456", "main.py"))
put("fuzz_cli", "run_torchrun_c10d", run_argv("--nnodes=1:4", "--nproc-per-node=2",
                                              "--max-restarts=3", "--rdzv-id=J",
                                              "--rdzv-backend=c10d", "--rdzv-endpoint=h:0",
                                              "--rdzv-conf=join_timeout=5,is_host=true",
                                              "train.py", "--backend", "gloo"))
put("fuzz_cli", "run_torchrun_prog", run_argv("--standalone", "-m", "-r", "3", "-t=0",
                                              "--monitor-interval", "1", "--start_method=fork",
                                              "--log-dir", "/tmp/l", "pkg.mod", "--nnodes", "x"))
put("fuzz_cli", "run_torchrun_refused", run_argv("--run-path", "--no-python", "--rdzv-backend",
                                                 "etcd", "--tee", "0:3,1:1", "s.py"))
put("fuzz_cli", "run_etcd", run_argv("--rdzv-backend=etcd-v2", "--rdzv_endpoint", "e1,[::1]:2379,e3:1",
                                     "--rdzv-conf", "protocol=https,cacert=/c,cert=/x,key=/k,user=u",
                                     "--discover", "etcd", "--nnodes", "2:3", "t.py"))
put("fuzz_cli", "run_straggler", run_argv("--straggler-factor", "1.5e0", "--hang-timeout=10",
                                          "--straggler-factor=0", "--", "x"))
put("fuzz_cli", "run_devices", run_argv("--nproc-per-node=gpu", "--numa-binding", "exclusive",
                                        "--sysfs-root", "/s", "--proc-root=/p", "--dev-root", "/d",
                                        "t.py"))
put("fuzz_cli", "run_cpu_bind", run_argv("--nproc_per_node", "auto", "--cpu-bind=numa",
                                         "--numa_binding=core-complex", "--", "x"))
put("fuzz_cli", "run_torchrun_new", run_argv("--duplicate-stdout-filters", "a,,b,,,c,",
                                             "--duplicate_stderr_filters=,", "--virtual-local-rank",
                                             "--shutdown-timeout=2.5", "t.py"))
# Unique prefixes of long options (as getopt_long) and an ambiguous one.
put("fuzz_cli", "abbrev", argv("slurm", "--nod", "2", "--nproc=4", "--part", "gpu", "--j", "x",
                               "--", "true"))
for i, v in enumerate(["123", "-9223372036854775808", "10.0.0.1:29400", "[::1]:80", ":0",
                       "8G", "512Mi", "2.5", "it's a $test", "link=ethernet;hca=mlx5_0:1;gid=3",
                       "link=none;hca=;gid=none"]):
    put("fuzz_cli", "value%d" % i, b"\x01" + v.encode())

# ---- cohort plot metrics ----
put("fuzz_plot", "metrics", '{"step": 1, "loss": 2.5, "tokens_per_s": 1000}\n'
    '{"step": 2, "loss": 2.4, "tokens_per_s": 1010.5}\n{"step": 3, "loss": 1e-3}\n')
put("fuzz_plot", "blank_and_extra", '\n{"step": 0, "loss": 3, "other": [1, {"a": null}]}\n\n')
put("fuzz_plot", "nonfinite", '{"step": 4, "loss": NaN, "tokens_per_s": Infinity, '
    '"lr": -Infinity, "note": "NaN \\" \\u00e9"}\n{"step": 5, "loss": 1, "x": "\\u0000"}\n')

# ---- PyTorch error files (agent_error_json_message) ----
put("fuzz_metrics_http", "get", "GET /metrics HTTP/1.1\r\nHost: 10.0.0.1:9400\r\nUser-Agent: "
    "Prometheus/2.42.0\r\nAccept: text/plain;version=0.0.4\r\n\r\n")
put("fuzz_metrics_http", "head_query", "HEAD /metrics?x=1 HTTP/1.0\n\n")
put("fuzz_metrics_http", "post", "POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc")
put("fuzz_metrics_http", "other", "GET /metricsx HTTP/1.1\r\n\r\n")
put("fuzz_metrics_http", "partial", "GET /metrics HTTP/1.1\r\nHost: a\r\n")
put("fuzz_metrics_http", "garbage", "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
put("fuzz_coll_control", "hello", b"hello pid=4242")
put("fuzz_coll_control", "ready", b"ready epoch=3 step=117\n")
put("fuzz_coll_control", "formed", b"formed epoch=4 step=-1 extra=1 why=a b=c")
put("fuzz_coll_control", "unknown", b"wave hand=left")
put("fuzz_errfile", "torch", '{"message": {"message": "ValueError: learning rate must be '
    'positive\\nsecond line\\t\\u00e9", "extraInfo": {"py_callstack": "Traceback ...", '
    '"timestamp": "1700000000"}}}')
put("fuzz_errfile", "plain", '{"message": "RuntimeError: \\u001b[31mred"}')
put("fuzz_errfile", "nested", '{"message": {"message": {"message": 3}}}')

# ---- the agent's control messages to a re-formable worker (coll_ctl_parse) ----
put("fuzz_coll_control", "form", "form epoch=3 rank=1 size=4 local_rank=1 local_size=2 node_rank=0 "
    "nnodes=2 store=10.0.0.1:29400 job=j1 master_addr=10.0.0.1 master_port=29500")
put("fuzz_coll_control", "form_v6", "form epoch=1 rank=0 size=1 store=[::1]:29400 job=x extra=1")
put("fuzz_coll_control", "reshape", "reshape epoch=2 why=node 3 lost: heartbeat stale for 5 s")
put("fuzz_coll_control", "reshape_grow", "reshape grow=1 defer_ms=20000 epoch=3 why=node 3 joins")
put("fuzz_coll_control", "stop", "stop why=fewer than 2 nodes left\n")
put("fuzz_coll_control", "bad_form", "form epoch=1 rank=2 size=2 store=h:1 job=j")
put("fuzz_coll_control", "unknown", "hello pid=42")

# ---- the end of a TCP connection whose rank aborted (coll_tcp_parse_abort) ----
def abort_record(body):
    head = b"\x7fcohort:aborted\n"
    tail = b"\x7fcohort:end-why\n"
    body = body[:448 - 32 - 1]
    return head + body + b"\0" * (448 - 32 - len(body)) + tail


put("fuzz_tcp_abort", "record", abort_record(b"2 rank 2: membership 0 ended (the agent: node 1 lost)"))
put("fuzz_tcp_abort", "after_payload", b"\x01\x02\x03" * 40 + abort_record(b"0 mismatch: x"))
put("fuzz_tcp_abort", "no_rank", abort_record(b"x why"))
put("fuzz_tcp_abort", "goodbye", b"\x7fcohort:goodbye\n")
