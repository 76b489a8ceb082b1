"""The rollout's worker: the agent loop, run inside the rollout's worker
sandbox, outside the GPU pool.

It asks the trainer's policy (an HTTP service the operator's network
config names, reached as http://policy.trainer:PORT) for the agent's next
command, runs it in the rollout's agent sandbox through the dsec API
(http://api.dsec.internal, as the worker's own key: it acts on its rollout
only), and appends each completed step to the rollout's status. It is the
single source of truth of the rollout's progress:

  - each step runs with the step key "step-N", so it runs at most once:
    a stream broken by a pause, or a worker started again, finds the step
    in the agent's journal (run_step) instead of running it twice;
  - the history it gives the policy is rebuilt from the rollout's status
    when it starts, so a worker started again goes on where it was;
  - when the policy does not answer (the trainer was preempted), it waits
    and asks again until the next trainer serves it.

Standard library and libdsec only (shipped beside this file by the
trainer). Its environment: DSEC_ROLLOUT and DSEC_ROLLOUT_MEMBERS (set by
the platform), POLICY_URL, and STEP_TIMEOUT (seconds, default 300).
"""

import asyncio
import json
import os
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from libdsec import DSecClient, DSecError, UnavailableError  # noqa: E402

ROLLOUT = os.environ["DSEC_ROLLOUT"]
MEMBERS = dict(kv.split("=", 1) for kv in os.environ["DSEC_ROLLOUT_MEMBERS"].split(","))
POLICY_URL = os.environ["POLICY_URL"]
STEP_TIMEOUT = float(os.environ.get("STEP_TIMEOUT", "300"))
# How long the worker waits for a policy that does not answer (a trainer
# being replaced) before it gives up.
POLICY_PATIENCE = float(os.environ.get("POLICY_PATIENCE", "3600"))


def log(*args):
    print(time.strftime("%H:%M:%S"), *args, flush=True)


def ask_policy(history):
    """POST the history to the policy; return its action. Retries until the
    policy answers (the trainer may be gone for a while)."""
    body = json.dumps({"rollout": ROLLOUT, "history": history}).encode()
    deadline = time.monotonic() + POLICY_PATIENCE
    wait = 0.2
    while True:
        req = urllib.request.Request(POLICY_URL + "/act", data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return json.loads(resp.read())
        except (urllib.error.URLError, OSError, ValueError) as e:
            if time.monotonic() > deadline:
                raise RuntimeError("the policy at %s did not answer for %ds: %s" % (POLICY_URL, POLICY_PATIENCE, e))
            log("policy not answering (%s); asking again in %.1fs" % (e, wait))
            time.sleep(wait)
            wait = min(wait * 2, 2.0)


async def retry(call, what):
    """Run an API call again while the API is unavailable (the worker's
    own sandbox was paused and resumed, say)."""
    wait = 0.2
    for attempt in range(30):
        try:
            return await call()
        except UnavailableError as e:
            log("%s: %s; again in %.1fs" % (what, e, wait))
            await asyncio.sleep(wait)
            wait = min(wait * 2, 5.0)
    return await call()


def history_of(status):
    """The steps done so far, from the rollout's status (step/NNN keys)."""
    steps = sorted(k for k in status if k.startswith("step/"))
    return [json.loads(status[k]) for k in steps]


async def main():
    # The API for sandboxes ignores any key: every call is the worker's own.
    async with DSecClient(os.environ.get("DSEC_ADDR", "http://api.dsec.internal"), "dsec-api") as client:
        rollout = await retry(lambda: client.rollout(ROLLOUT), "read the rollout")
        if rollout.status.get("state") == "done":
            log("rollout %s is done already" % ROLLOUT)
            return
        agent = client.sandbox(MEMBERS["agent"])
        history = history_of(rollout.status)
        log("rollout %s: agent %s, %d steps done" % (ROLLOUT, agent.id, len(history)))
        while True:
            action = await asyncio.get_running_loop().run_in_executor(None, ask_policy, history)
            if action.get("done"):
                await retry(lambda: rollout.set_status({"state": "done", "answer": str(action.get("answer", ""))}),
                            "set the status")
                log("done: %s" % action.get("answer"))
                return
            i = len(history)
            r = await retry(lambda: agent.run_step("step-%d" % i, action["command"], timeout=STEP_TIMEOUT),
                            "run step %d" % i)
            rec = {"step": i, "command": action["command"], "exit_code": r.code, "stdout": r.stdout[-500:],
                   "source": r.source}
            history.append(rec)
            await retry(lambda: rollout.set_status({"step/%03d" % i: json.dumps(rec), "progress": str(i + 1),
                                                    "state": "running"}), "set the status")
            log("step %d (%s): exit %d" % (i, r.source, r.code))


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except DSecError as e:
        log("worker failed: %s" % e)
        sys.exit(1)
