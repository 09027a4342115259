"""A Ray driver for integration_tests/test_ray.py: places two trainings by memory with salus.ray and runs an
unmodified Keras script in each, as a subprocess of a Ray actor on the chosen node.

Runs with the Ray venv's python (.venv-ray: ray and the salus package, no TensorFlow):

    ray_driver.py HEAD_ADDRESS TRAIN_PYTHON TRAIN_SCRIPT

Line protocol on stdout (the test reads it; after each of the first three the driver waits for a line on stdin):
  HOLDING {json}  both trainings have trained and hold their sessions open (WORKLOAD_HOLD=1)
  RAN {json}      both have finished; the placements (tokens, reservations, actors) are still held. The test
                  kills the big placement's server here (SIGKILL), starts it again, and has another tenant
                  reserve memory on the head
  AGAIN {json}    the Salus nodes as salus_nodes() sees them then (Ray's figure and the server's), a 128 MiB
                  placement made and released (where it landed: the head's server has no room for it then),
                  and the big placement's next training holding its session open
  RESULT {json}   at the end, after both tokens were released
Anything else on stdout is Ray's.
"""

import json
import os
import subprocess
import sys
import time

import ray

import salus.ray as sray

head, train_python, train_script = sys.argv[1:4]
ray.init(address=head, logging_level="ERROR", log_to_driver=False)

deadline = time.monotonic() + 120
while len(sray.salus_nodes()) < 2 and time.monotonic() < deadline:
    time.sleep(0.5)
nodes = {n.node_id: {"server": n.server, "total_mib": n.total_mib} for n in sray.salus_nodes()}
assert len(nodes) == 2, f"expected two Salus nodes, saw {nodes}"


def no_room(memory) -> str:
    try:
        p = sray.place(memory)
    except sray.NoRoom as e:
        return str(e)
    p.release()
    return ""


@ray.remote(num_cpus=0, max_restarts=0)
class Trainer:
    """Runs the training script with this worker's environment (runtime_env's SALUS_SERVER and SALUS_TOKEN)."""

    def start(self, python: str, script: str, extra: dict) -> dict:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(extra)
        self.proc = subprocess.Popen([python, script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env)
        line = self.proc.stdout.readline()  # "HOLD" after fit, session still open
        return {"hold": line.strip(), "node_id": ray.get_runtime_context().get_node_id(),
                "server": os.environ.get("SALUS_SERVER"), "has_token": bool(os.environ.get("SALUS_TOKEN")),
                "pid": self.proc.pid}

    def finish(self) -> dict:
        out, err = self.proc.communicate("\n", timeout=300)
        return {"rc": self.proc.returncode, "stdout": out, "stderr": err[-4000:]}


result = {"nodes": nodes}
# Larger than any node: refused before any token is issued, naming the largest room.
result["too_big"] = no_room("3GiB")

big = sray.place("1536MiB", expires="10m", name="ray-big")      # fits only the 2 GiB node
small = sray.place("768MiB", expires="10m", name="ray-small")    # best fit: the 1 GiB node
placements = {"big": big, "small": small}
extra = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_USE_LEGACY_KERAS": "1", "PYTHONHASHSEED": "0", "WORKLOAD_HOLD": "1"}
actors = {k: Trainer.options(**p.options).remote() for k, p in placements.items()}
started = dict(zip(placements, ray.get([actors[k].start.remote(train_python, train_script, extra)
                                        for k in placements])))
# Both servers' reservations are taken now (512 MiB and 256 MiB left), whatever Ray's view says yet:
# a third placement of 600 MiB finds no room (in Ray's accounting, or the servers refuse its token).
result["third"] = no_room("600MiB")

result["placed"] = {k: {"node_id": p.node_id, "server": p.server, "mib": p.mib, "tenant": p.tenant,
                        "token_id": p.token_id, "env_keys": sorted(p.options["runtime_env"]["env_vars"])}
                    for k, p in placements.items()}
result["started"] = started
print("HOLDING " + json.dumps(result), flush=True)
sys.stdin.readline()

result["finished"] = dict(zip(placements, ray.get([actors[k].finish.remote() for k in placements])))
print("RAN " + json.dumps({"finished": result["finished"]}), flush=True)
sys.stdin.readline()

# Ray still offers the head's salus_mem_mib, but its server has given it to another tenant meanwhile:
# salus_nodes() and place() count the server's figure, so the placement goes to the worker straight away.
result["seen"] = {n.server: {"available_mib": n.available_mib, "ray_available_mib": n.ray_available_mib,
                             "server_unreserved_mib": n.server_unreserved_mib, "server_error": n.server_error}
                  for n in sray.salus_nodes()}
other = sray.place("128MiB", expires="10m", name="ray-other")
result["other"] = {"node_id": other.node_id, "server": other.server, "refusals": other.refusals,
                   "revoked": other.release()}
# The big placement's next run, on its server restarted meanwhile, with the same token.
result["started_again"] = ray.get(actors["big"].start.remote(train_python, train_script, extra))
print("AGAIN " + json.dumps({k: result[k] for k in ("seen", "other", "started_again")}), flush=True)
sys.stdin.readline()
result["finished_again"] = ray.get(actors["big"].finish.remote())
result["revoked"] = {k: p.release() for k, p in placements.items()}
result["released_again"] = {k: p.release() for k, p in placements.items()}  # idempotent: nothing more
print("RESULT " + json.dumps(result), flush=True)
ray.shutdown()
