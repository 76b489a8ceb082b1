"""The trainer's side of a rollout job: a stub policy served over HTTP (a
stand-in for the model on the GPUs, so this runs without one), rollouts
made through the dsec API, and reconnection by rollout ID after the
trainer was preempted.

    python3 trainer.py --job demo --rollouts 2 --steps 5 --policy-listen HOST:8765

makes two rollouts (a worker sandbox with Python, an agent sandbox), ships
worker/worker.py and libdsec into each worker, starts it, serves the
policy the workers ask for each step, and prints each rollout's result as
a JSON line when its worker is done. The rollouts' IDs are kept in a state
file (--state, default demo.rollouts.json); started again with the same
--state, the trainer resumes the job's sandboxes (paused meanwhile by a
preemption hook: dsec pause -l job=demo), reconnects to its rollouts by ID
and waits for them without running any completed step again.

The stub policy is a scripted agent: step i appends "i" to
/workspace/effects.log in the agent's sandbox (a side effect that must happen
once per step) and records a word count, then the answer is the last
count. --step-seconds makes each step take that long (sleep), --think-
seconds makes the policy that slow to answer (a model thinking).
"""

import argparse
import asyncio
import http.server
import json
import os
import secrets
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# The SDK from this repository unless libdsec is installed.
try:
    import libdsec  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(HERE, "..", "..", "sdk", "python"))
    import libdsec  # noqa: F401

from libdsec import DSecClient, NotFoundError, member  # noqa: E402

LIBDSEC_DIR = os.path.dirname(os.path.abspath(libdsec.__file__))
WORKER_DIR = os.path.join(HERE, "worker")


# --- the stub policy -------------------------------------------------------

def policy(history, steps, step_seconds):
    """The next action after history: the agent's command, or done."""
    i = len(history)
    if i >= steps:
        last = history[-1]["stdout"].strip() if history else ""
        return {"done": True, "answer": last}
    cmd = ("mkdir -p /workspace && echo %d >> /workspace/effects.log && sleep %g && "
           "wc -l < /workspace/effects.log" % (i, step_seconds))
    return {"done": False, "command": cmd}


def serve_policy(listen, steps, step_seconds, think_seconds):
    host, port = listen.rsplit(":", 1)

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
            time.sleep(think_seconds)
            out = json.dumps(policy(body.get("history") or [], steps, step_seconds)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

    srv = http.server.ThreadingHTTPServer((host, int(port)), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


# --- rollouts --------------------------------------------------------------

def rollout_spec(args):
    return {
        "labels": {"job": args.job},
        "ttl": args.ttl,
        "members": [
            member("worker", args.worker_image, role="worker", memory="256M",
                   env={"POLICY_URL": args.policy_url, "DSEC_ADDR": "http://api.dsec.internal",
                        "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"},
                   network="allow=dsec-api," + args.policy_service),
            member("agent", args.agent_image, memory="128M"),
        ],
    }


def load_state(path):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def save_state(path, state):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f)
    os.replace(tmp, path)


async def resume_job(client, job):
    """Resume the job's paused sandboxes (a preemption hook paused them by
    label: dsec pause -l job=JOB). Any request to a paused sandbox would
    resume it too; this resumes them all at once, so that the workers run
    on before the trainer asks anything."""
    try:
        results = await client.resume(labels={"job": job}, timeout=120)
        for r in results:
            if r.error:
                print("resume %s: %s" % (r.id, r.error), file=sys.stderr)
    except libdsec.FailedPreconditionError as e:
        print("resume: %s" % e, file=sys.stderr)


async def ensure_worker(ro):
    """Ship the worker and start it, once: its exec's step key tells a
    trainer started again that it runs (or ran) already."""
    worker = ro.worker()
    if await worker.list_execs(step_keys=["worker"]):
        return
    await worker.upload_dir(WORKER_DIR, "/opt/worker", make_parents=True)
    await worker.upload_dir(LIBDSEC_DIR, "/opt/worker/libdsec", make_parents=True)
    try:
        await worker.exec_detached(["python3", "/opt/worker/worker.py"], step_key="worker")
    except libdsec.AlreadyExistsError:
        pass  # another trainer started it meanwhile


async def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--job", default="demo", help="the job's name: the label job=NAME of its sandboxes")
    ap.add_argument("--rollouts", type=int, default=2, help="how many rollouts")
    ap.add_argument("--steps", type=int, default=5, help="steps of each rollout's agent (at most 50)")
    ap.add_argument("--policy-listen", required=True,
                    help="HOST:PORT to serve the policy on: an address of this host that the network config's "
                         "policy service names (not loopback: sandboxes reach it through the node's proxy)")
    ap.add_argument("--policy-service", default="trainer", help="the network config's service of the policy")
    ap.add_argument("--policy-url", default="",
                    help="the policy's URL as workers see it (default http://policy.trainer:PORT)")
    ap.add_argument("--worker-image", default="rollout/python", help="image with python3 for the workers")
    ap.add_argument("--agent-image", default="busybox", help="image of the agents' sandboxes")
    ap.add_argument("--step-seconds", type=float, default=1.0, help="how long each agent step takes")
    ap.add_argument("--think-seconds", type=float, default=0.2, help="how long the policy takes to answer")
    ap.add_argument("--ttl", type=int, default=3600, help="the rollouts' TTL in seconds")
    ap.add_argument("--state", default="", help="where the rollouts' IDs are kept (default JOB.rollouts.json)")
    ap.add_argument("--keep", action="store_true", help="keep the rollouts when they are done")
    args = ap.parse_args()
    if not 1 <= args.steps <= 50:
        ap.error("--steps must be 1 to 50 (a rollout's status holds 64 keys)")
    args.policy_url = args.policy_url or "http://policy.trainer:%s" % args.policy_listen.rsplit(":", 1)[1]
    args.state = args.state or args.job + ".rollouts.json"

    serve_policy(args.policy_listen, args.steps, args.step_seconds, args.think_seconds)
    async with DSecClient() as client:
        state = load_state(args.state)
        if state is None:
            # A run of its own: the idempotency keys below are this run's,
            # so the job's name can be used again once its rollouts are
            # deleted (a key names the rollout it made, deleted or not).
            state = {"job": args.job, "run": secrets.token_hex(6), "rollouts": []}
            save_state(args.state, state)
        else:
            print("reconnecting to %d rollouts of job %s" % (len(state["rollouts"]), state["job"]), flush=True)
            await resume_job(client, state["job"])
        for i in range(len(state["rollouts"]), args.rollouts):
            # The key makes the create safe to retry: a trainer killed
            # here gets the same rollout when it starts again.
            key = "%s/%s/%d" % (args.job, state["run"], i)
            ro = await client.create_rollout(rollout_spec(args), idempotency_key=key)
            state["rollouts"].append(ro.id)
            save_state(args.state, state)
            print("created rollout %s" % ro.id, flush=True)
        rollouts = [await client.rollout(id) for id in state["rollouts"]]
        for ro in rollouts:
            await ensure_worker(ro)
        seen = {}
        pending = {ro.id: ro for ro in rollouts}
        while pending:
            for ro in list(pending.values()):
                try:
                    await ro.refresh()
                except NotFoundError:
                    print(json.dumps({"rollout": ro.id, "error": "gone"}), flush=True)
                    del pending[ro.id]
                    continue
                progress = ro.status.get("progress", "0")
                if seen.get(ro.id) != progress:
                    seen[ro.id] = progress
                    print("rollout %s: %s/%d steps" % (ro.id, progress, args.steps), flush=True)
                if ro.status.get("state") == "done":
                    print(json.dumps({"rollout": ro.id, "answer": ro.status.get("answer"), "steps": int(progress)}),
                          flush=True)
                    del pending[ro.id]
                    if not args.keep:
                        await ro.delete()
            await asyncio.sleep(0.3)
    if not args.keep:
        os.remove(args.state)


if __name__ == "__main__":
    asyncio.run(main())
