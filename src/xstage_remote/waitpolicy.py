"""When a waiter on the shared region spins and when it blocks: a pure policy.

Nothing here reads a clock, a file or a CPU number. The doorbell (``shm.py``) measures and
this module decides, so the inputs of one run, recorded as a trace, replay to the same
decisions (``tests/wire/test_waitpolicy.py`` replays traces recorded from real runs,
``scripts/record_wait_traces.py``).

A spin answers a short call in a few microseconds where a blocked waiter pays two system calls
and a wake-up (10-50 µs on a small machine); but a spinner holds a CPU, and when every CPU is
wanted it holds it *from* someone: the peer that computes the answer, or a neighbour's work. On
a 2-core machine with two busy neighbours a 64 B call then took ~2 ms instead of ~10 µs. A
blocked waiter costs the kernel's wake-up, which hands the CPU straight over.

Inputs of one decision (``decide``):

* ``load``: ``(running, cpus)``, the machine's runnable tasks (this waiter included) and its
  CPUs, as the doorbell last sampled them (``/proc/loadavg``; ``None`` where unknown). Both
  count the whole machine, so the comparison holds in a container as on a host.
* ``expected``: how long the answer is expected to take, in seconds (the caller: the worker's
  recent compute; the worker, waiting for a request: ``None``).

What each wait reports back (``observe``): how long it spun, its longest single yield, how the
spin ended (``OUTCOMES``) and how long the answer took.

Rules, in order; a decision names the rule that made it:

1. ``off``: spinning is off (a CPU without ordered loads and stores, see ``shm.py``), or the
   budget is zero.
2. ``one_cpu``: this process may run on one CPU only: a spinner holds the CPU the answer needs.
3. ``long_call``: the answer is expected later than ``long_call`` seconds: a spin from the
   start cannot pay, and on a small machine it steals a core from the runtime's own threads.
   ``near_end``: the same wait when the load sample shows no more runnable tasks than CPUs
   (the waiter, sampled while it runs, and the peer computing its answer each have one: the
   spin takes only the waiter's own CPU) and no backoff runs: block until ``near_end`` seconds
   before the expected answer (``WaitPolicy.wake``, seconds after the wait begins), then spin
   for at most
   ``3 * near_end``, then block. A blocked waiter woken by the answer pays the wake-up of a CPU
   that slept through the whole call, deep in its idle states: on the H200 host (16 Xeon
   cores) the answer of a 1.3 ms CUDA stage reached the caller 90-124 µs after the worker
   published it, against 6-13 µs for a waiter that was awake (``benchmarks/gpu_stage.py``'s
   split). A call that ends earlier than expected still rings the sleeper at once; a spin that
   does not pay counts toward rule 4's backoff like any other.
4. ``backoff``: recent spins did not pay: ``failures`` of the last ``window`` spins were
   preempted (one yield lasted longer than ``preempted`` seconds: another task ran on this CPU
   meanwhile) or found nothing for their whole budget (beside busy neighbours a worker's spin
   often expires without a long yield: its caller is the one kept off a CPU). Block for the
   next ``backoff`` waits, then spin once more (a probe); each probe that does not pay doubles
   the backoff (``min_backoff`` up to ``max_backoff``), each answered spin halves it (below
   ``min_backoff``: none). A load sample with no more runnable tasks than CPUs ends a backoff
   early (after ``min_backoff`` waits): when the neighbours stop, spinning resumes within a few
   calls instead of hundreds. One unpaid spin alone is no pattern: neighbours that run in bursts
   preempt ~1% of spins (this 2-core VM at a load average of 4), and blocking there made the
   median 64 B overhead 40 µs instead of 14 µs and its p99 worse, not better (blocked wake-ups
   wait behind the same neighbours). Neighbours that never sleep preempt every spin, so two
   in a row start the backoff. A *held* spin (rule 8) that found nothing for its hold window
   (and ended within twice that) is not counted as unpaid: it cost at most the window
   (50 µs), about what the blocked wake-up it would be traded for costs beside busy
   neighbours, and the peer it waited for (the caller between two calls, kept off a CPU for a
   moment) comes back in the next wait. Counted, on the 2-vCPU VM beside 2 busy loops
   (``benchmarks/transport.py --busy 2``), ~16% of the worker's held spins expired, two in a
   window of 8 started backoffs that doubled, and the worker blocked in 588 of 800 waits:
   the 64 B half round trip was 24.5-31.8 µs (2.1-2.7x the TCP echo) in one run of three;
   not counted, 11.8-15.1 µs in six arms of three runs, the worker blocking in 23-72 waits.
5. ``oversubscribed`` (only for spins that yield on every check, ``hold`` 0): the backoff is
   over, but more tasks are runnable than there are CPUs (and ``load_margin``):
   the probe waits for a sample that shows a CPU free, for as many waits again as the backoff
   at most (a crowded machine doubles the time between probes). Outside a backoff the load
   alone stops a spin only by rule 6: a load sample cannot tell neighbours that run in bursts
   from neighbours that never sleep; the spins themselves can, and rule 6 holds that even a
   spin that pays is not worth its CPU on a crowded machine. A *held* spin (``hold`` > 0: it
   yields only once every ``hold`` seconds, ``shm.SPIN_YIELD_SECONDS``) is not handed to a
   neighbour by a yield before a small call's answer comes, so beside busy neighbours it pays
   and a crowded sample holds no probe back: its own outcomes decide (rule 4). Measured on the
   2-vCPU VM beside 2 busy loops (``benchmarks/hotpath.py``, docs/performance.md#hotpath): with rule 5
   holding back the probes of held spins, both sides stayed blocked in most waits and the 64 B
   half round trip was 14.8 and 28.7 µs (1.39x and 2.72x the TCP echo); without, 11.9 and
   11.4 µs (1.11x and 1.08x), quiet unchanged.
6. ``crowded`` (only where ``crowd_blocks``: the doorbell sets it with ``XSTAGE_CROWD_BLOCKS=1``,
   off by default): no backoff is running, but
   more tasks are runnable than there are CPUs (and ``load_margin``): block. A spin that is
   answered still costs its CPU time, and on a crowded machine that time is taken from the
   neighbours (an engine's decode threads) and counts against the spinner when the scheduler
   (EEVDF) decides whether a woken task may preempt one. Measured on the 2-vCPU VM beside 2
   busy loops (``benchmarks/hotpath.py --compare``, seven interleaved runs): before
   this rule spins that paid (answered ~9 in 10) left the caller 31-53 µs and the worker
   37-53 µs of CPU per 64 B call; with it 0.56-0.92x that CPU, for a half round trip of
   0.75-1.25x: on a VM loaded by other work as well the spins bought no latency, but in the
   least loaded run they did (15.2 against 19.1 µs), so the rule trades latency for the
   neighbours' CPU and is a choice, not the default.
   A probe after a backoff still goes by rule 5, and a sample with room spins again at once,
   so a machine that empties is spun on within a sample (``LOAD_SAMPLE_SECONDS`` in
   ``shm.py``).
7. ``slow_answers``: most of the last ``window`` answers came later than the spin budget (a
   worker whose caller calls every few milliseconds): spinning would burn the budget every
   time. Blocked waits keep reporting their answers' times, so this rule lets go as soon as
   answers come quickly again.
8. ``held``: a crowded sample (more runnable tasks than CPUs and ``load_margin``) where spins
   are held (``hold`` > 0): spin for the hold window only, then block. Past the window the spin
   would yield, and on a crowded machine a yield hands the CPU to a neighbour for a scheduler
   slice while the answer comes: the waiter then saw it milliseconds late (on the 2-vCPU VM
   beside 2 busy loops, ~6% of the caller's spins, each answered 2-9 ms late); a blocked
   waiter is woken by the ring and preempts the neighbour instead.
9. ``spin``: otherwise, spin for the budget (``spin_seconds``), then block.

Blocking is the safe side: a wrong block costs a wake-up (microseconds), a wrong spin can cost
a scheduler slice (milliseconds).
"""

from collections import namedtuple

__all__ = [
    "OUTCOMES",
    "RULES",
    "Decision",
    "Load",
    "Wait",
    "WaitPolicy",
    "describe",
]

#: The rules in the order they are tried (module docstring).
RULES = ("off", "one_cpu", "long_call", "near_end", "backoff", "oversubscribed", "crowded",
         "slow_answers", "held", "spin")

#: How a wait ended: ``ready`` (answered before it began), ``answered`` (during the spin),
#: ``expired`` (the budget ran out), ``preempted`` (a yield was preempted: the spin stopped at
#: once), ``shared`` (the peer was found on this CPU and moving off failed: see ``shm.py``),
#: ``blocked`` (no spin: decided to block).
OUTCOMES = ("ready", "answered", "expired", "preempted", "shared", "blocked")

#: Machine-wide runnable tasks (the waiter included) and the machine's CPUs.
Load = namedtuple("Load", ["running", "cpus"])

#: Seconds to spin before blocking (0: block at once), and the rule that decided it. A
#: ``near_end`` decision sleeps first, until ``WaitPolicy.wake(expected)`` after the wait begins.
Decision = namedtuple("Decision", ["spin", "rule"])

#: What one wait saw: seconds spun, the longest single yield, how it ended, seconds to answer.
Wait = namedtuple("Wait", ["spun", "longest_yield", "outcome", "latency"])

#: The blocking decisions, made once (a decision is taken on every call).
_BLOCK = {rule: Decision(0.0, rule) for rule in RULES if rule not in ("spin", "near_end", "held")}


class WaitPolicy:
    """The spin-or-block decision of one waiter (one side of one region).

    Args:
        spin_seconds: the spin budget of rule 7.
        allowed_cpus: CPUs this process may run on (rule 2).
        spinning: False where plain loads and stores are not ordered (rule 1).
        long_call: rule 3's bound, seconds.
        preempted: rule 4's yield, seconds: longer means another task ran on this CPU.
        window: rule 6's number of recent answers, and rule 4's number of recent spins.
        failures: rule 4's unpaid spins among the last ``window`` spins that start a backoff.
        min_backoff: rule 4's first backoff, in waits.
        max_backoff: rule 4's longest backoff, in waits.
        near_end: rule 3's lead, seconds before the expected answer (0: off).
        load_margin: runnable tasks beyond the CPUs that rule 5 still counts as room: the
            peer's runtime threads spin a while after each run (onnxruntime's pool), so on a
            quiet 2-core machine the sample showed 3 runnable tasks in 63% of the waits. (Rule
            4 ends a backoff early only on a sample with no task beyond the CPUs: beside two
            busy loops on 2 cores the sample shows 3 whenever the caller sleeps.)
        crowd_blocks: rule 6 is on: a crowded sample blocks outside a backoff too (off by
            default; the doorbell turns it on with ``XSTAGE_CROWD_BLOCKS=1``).
        hold: seconds a spin checks without yielding (``shm.SPIN_YIELD_SECONDS``); 0: it
            yields before every check. Rule 5 holds back only the probes of spins that yield
            on every check.
    """

    def __init__(self, spin_seconds, allowed_cpus, spinning=True, long_call=0.0002,
                 preempted=0.0002, window=8, failures=2, min_backoff=8,
                 max_backoff=256, load_margin=1, crowd_blocks=False, near_end=0.0,
                 hold=0.0):
        self.spin_seconds = float(spin_seconds)
        self.allowed_cpus = int(allowed_cpus)
        self.spinning = bool(spinning)
        self.long_call = float(long_call)
        self.preempted = float(preempted)
        self.window = int(window)
        self.min_backoff = int(min_backoff)
        self.max_backoff = int(max_backoff)
        self.failures = int(failures)
        self.load_margin = int(load_margin)
        self.crowd_blocks = bool(crowd_blocks)
        self.near_end = float(near_end)
        self.hold = float(hold)
        self._slow = [False] * self.window  # a ring: which recent answers were slow
        self._slow_at = 0
        self._slow_count = 0
        self._unpaid = [False] * self.window  # a ring: which recent spins did not pay
        self._spun_at = 0
        self._unpaid_count = 0
        self._backoff = 0  # the current backoff length, in waits (0: none)
        self._blocked_for = 0  # waits left in the current backoff
        self._since_probe = 0  # waits blocked since the last preempted spin
        self._held_last = False  # the last decision was rule 8's (a spin cut to its window)
        #: How many decisions each rule made, and how the waits ended.
        self.rules = dict.fromkeys(RULES, 0)
        self._spin = Decision(self.spin_seconds, "spin")
        self._held = Decision(round(min(self.hold, self.spin_seconds), 9), "held")
        # to the nanosecond, as traces keep times (3 * 0.0001 is not 0.0003 in binary)
        self._near_end = Decision(round(min(3 * self.near_end, self.spin_seconds), 9), "near_end")
        self.outcomes = dict.fromkeys(OUTCOMES, 0)

    def decide(self, load, expected=None):
        """The decision for the wait about to begin (rules 1-9); counts it.

        Args:
            load: ``Load(running, cpus)`` or None (unknown).
            expected: seconds the answer is expected to take, or None (unknown).
        """
        decision = self._rule(load, expected)
        self.rules[decision.rule] += 1
        self._held_last = decision is self._held
        return decision

    def _rule(self, load, expected):
        if not self.spinning or self.spin_seconds <= 0:
            return _BLOCK["off"]
        if self.allowed_cpus <= 1:
            return _BLOCK["one_cpu"]
        if expected is not None and expected > self.long_call:
            if self._blocked_for > 0:  # a near-end spin did not pay: this wait counts off
                self._blocked_for -= 1
            elif self.near_end > 0 and load is not None and load[0] <= load[1] \
                    and expected > self.near_end:
                return self._near_end
            return _BLOCK["long_call"]
        if self._blocked_for > 0:
            if load is not None and load[0] <= load[1] and self._since_probe >= self.min_backoff:
                self._blocked_for = 0  # a CPU is free again: probe now, not in hundreds of waits
            else:
                self._blocked_for -= 1
                self._since_probe += 1
                return _BLOCK["backoff"]
        crowded = load is not None and load[0] > load[1] + self.load_margin
        if crowded:
            if self._backoff:
                if not self.hold and self._since_probe < 2 * self._backoff:
                    self._since_probe += 1
                    return _BLOCK["oversubscribed"]
            elif self.crowd_blocks:
                return _BLOCK["crowded"]
        if 2 * self._slow_count > self.window:
            return _BLOCK["slow_answers"]
        self._since_probe = 0  # a spin while backing off is the probe
        return self._held if crowded and self.hold > 0 else self._spin

    def wake(self, expected):
        """Seconds after the wait begins that a ``near_end`` decision sleeps before spinning."""
        return expected - self.near_end

    def observe(self, spun, longest_yield, outcome, latency):
        """Learn from a finished wait (rules 4 and 7); the arguments are ``Wait``'s fields."""
        self.outcomes[outcome] += 1
        slow = latency > self.spin_seconds
        at = self._slow_at
        self._slow_count += slow - self._slow[at]
        self._slow[at] = slow
        self._slow_at = (at + 1) % self.window
        if spun <= 0:
            return
        # The spin did not pay: it was preempted, or nothing came for its whole budget (a
        # held spin that expired at its hold window excepted: rule 4).
        unpaid = outcome == "preempted" or longest_yield > self.preempted or (
            outcome == "expired" and not (self._held_last and spun <= 2 * self.hold))
        at = self._spun_at
        self._unpaid_count += unpaid - self._unpaid[at]
        self._unpaid[at] = unpaid
        self._spun_at = (at + 1) % self.window
        if unpaid and (self._backoff or self._unpaid_count >= self.failures):
            # A probe that did not pay, or the failures-th such spin of the last window.
            self._backoff = min(max(2 * self._backoff, self.min_backoff), self.max_backoff)
            self._blocked_for = self._backoff
            self._since_probe = 0
        elif outcome == "answered":
            # Halved, not forgotten: beside busy neighbours a probe is answered now and then,
            # and the next spins would fail again.
            self._backoff = self._backoff // 2 if self._backoff > self.min_backoff else 0

    def summary(self):
        """The decisions and outcomes so far, for ``--verbose`` and benchmarks (counts only)."""
        return {"rules": {k: v for k, v in self.rules.items() if v},
                "outcomes": {k: v for k, v in self.outcomes.items() if v},
                "backoff": self._backoff}


def describe(summary):
    """One line for a summary: ``spin 180 (answered 175, expired 5), block 20 (long_call 20)``;
    then ``held N``: the spins among them cut to the hold window (rule 8), and ``near end N``:
    the waits that slept until near the expected answer, then spun."""
    rules = summary.get("rules", {})
    outcomes = summary.get("outcomes", {})
    blocking = [k for k in rules if k not in ("spin", "near_end", "held")]
    blocks = ", ".join("%s %d" % (k, rules[k]) for k in blocking)
    spun = ", ".join("%s %d" % (k, v) for k, v in outcomes.items() if k not in ("blocked", "ready"))
    parts = ["spin %d (%s)" % (rules.get("spin", 0) + rules.get("held", 0), spun or "none"),
             "block %d (%s)" % (sum(rules[k] for k in blocking), blocks or "none")]
    if rules.get("held"):  # spins cut to the hold window on a crowded sample (rule 8)
        parts.append("held %d" % rules["held"])
    if rules.get("near_end"):  # after the two counts, which readers (and tests) expect first
        parts.append("near end %d" % rules["near_end"])
    if outcomes.get("ready"):
        parts.append("answered before waiting %d" % outcomes["ready"])
    return ", ".join(parts)
