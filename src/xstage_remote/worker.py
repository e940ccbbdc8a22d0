"""The worker: one process, one stage, driven by one client over the wire.

Started by the client with the control socket (and, on the same kernel, a doorbell) as
inherited descriptors, or told to connect back over TCP when it runs on the other side of
WSL. Its stdin carries the secret as a first line (never argv) and then stays open: that is
the death pipe. A watchdog thread reads it, and when the client dies and the pipe ends the
worker exits at once, even while the main thread is stuck in a long compile. WSL interop
forwards stdin to a Windows process, so the same rule holds across the two systems. Its fd 1
and fd 2 are the client's log file, so whatever a native runtime prints never reaches the
protocol. Python 3.9 syntax.

Lifecycle: hello → (load → loaded) → (attach → attached)? → run* → shutdown → bye.
"""

import argparse
import os
import platform
import socket
import struct
import sys
import threading
import time
import traceback

import numpy as np

from . import PROTOCOL_VERSION, memory, package_hash, wire
from . import shm as shm_mod
from .tuning import TransportTuning
from .worker_transport import ChannelStream, InlineStream, receive_region

__all__ = ["main"]

FEATURES = ["inline", "shm-memfd", "shm-named", "death-stdin", "evidence", "bell-eventfd",
            "fast-frames", "state-read", "check-sets"]
#: Exit status when the client vanished (stdin ended or the control stream closed).
EXIT_ORPHANED = 70


def _watchdog(fd):
    """The death pipe ended (the client is gone): end this worker and everything it started.

    The worker leads a process group of its own (the client starts it in a new session), so
    a process a runtime started goes with it: nothing outlives a client killed with SIGKILL.
    """
    try:
        while os.read(fd, 1):
            pass
    except OSError:
        pass
    _orphaned()


def _orphaned():
    """The client is gone: SIGKILL what this worker started (its process group), then exit."""
    sys.stdout.flush()
    sys.stderr.flush()
    _end_group()
    os._exit(EXIT_ORPHANED)


def _end_group():
    """SIGKILL every other member of this worker's process group (it leads one of its own).

    Found in ``/proc`` so the worker itself still exits with ``EXIT_ORPHANED``; a scan repeats
    while it finds members (one may have started another meanwhile). Without ``/proc`` the
    whole group is killed, this process included.
    """
    me = os.getpid()
    if not hasattr(os, "killpg") or os.getpgrp() != me:
        return
    for _ in range(5):
        try:
            pids = [int(n) for n in os.listdir("/proc") if n.isdigit()]
        except OSError:
            try:
                os.killpg(me, 9)
            except OSError:
                pass
            return
        found = False
        for pid in pids:
            if pid == me:
                continue
            try:
                if os.getpgid(pid) == me:
                    os.kill(pid, 9)
                    found = True
            except OSError:
                pass
        if not found:
            return


class State:
    """State pairs kept in this worker: an output fed back as an input on the next call.

    Declared by the stage's manifest and sent in ``load``'s options as
    ``[{"input", "output", "init": "zeros" | "file", "path"}]``. The values never cross the
    wire: each call reads the inputs from here and leaves the outputs here. ``fresh`` is true
    while the state is the initial value (a new worker, or after a reset); the next answer
    says so.
    """

    def __init__(self, specs, runtime):
        if not isinstance(specs, list) or not specs:
            raise ValueError("state: a non-empty list of {input, output, init} is expected")
        ins = {d["name"]: d for d in runtime.inputs}
        outs = {d["name"]: d for d in runtime.outputs}
        self.init, self.values, self.by_output = {}, {}, {}
        for spec in specs:
            if not isinstance(spec, dict) or not {"input", "output", "init"} <= set(spec):
                raise ValueError("state: each pair is {input, output, init[, path]}")
            name, out = spec["input"], spec["output"]
            if name not in ins or out not in outs or name in self.init or out in self.by_output:
                raise ValueError("state pair %r -> %r: not an input and an output of the stage "
                                 "(each used once)" % (out, name))
            decl, odecl = ins[name], outs[out]
            shape = decl["shape"]
            if not all(isinstance(d, int) for d in shape) or list(shape) != list(odecl["shape"]) \
                    or decl["dtype"] != odecl["dtype"]:
                raise ValueError("state pair %r -> %r: %s%s and %s%s must be one fixed shape and "
                                 "dtype" % (out, name, odecl["dtype"], odecl["shape"],
                                            decl["dtype"], shape))
            dtype = wire.dtype_of_tag(decl["dtype"])
            if spec["init"] == "zeros":
                value = np.zeros(tuple(shape), dtype=dtype)
            elif spec["init"] == "file" and isinstance(spec.get("path"), str):
                value = np.load(spec["path"], allow_pickle=False)
                if value.dtype != dtype or list(value.shape) != list(shape):
                    raise ValueError("state %r: %s holds %s%s, the input is %s%s"
                                     % (name, spec["path"], value.dtype, list(value.shape),
                                        dtype, list(shape)))
            else:
                raise ValueError("state %r: init must be \"zeros\" or \"file\" with a path" % name)
            self.init[name] = np.ascontiguousarray(value)
            self.values[name] = self.init[name].copy()  # a fixed buffer: bindings keep its address
            self.by_output[out] = name
        self.fresh = True

    def reset(self):
        for name, value in self.init.items():
            np.copyto(self.values[name], value)
        self.fresh = True

    def keep(self, outputs):
        """Copy the state outputs into the state; the other outputs are returned."""
        rest = {}
        for name, value in outputs.items():
            target = self.by_output.get(name)
            if target is None:
                rest[name] = value
            else:
                np.copyto(self.values[target], value)
        self.fresh = False
        return rest


class Worker:
    def __init__(self, sock, bell, generation=1, channel=None):
        self.sock = sock
        self.generation = generation
        #: The client's knobs (``load`` brings them; the defaults until then).
        self.tuning = TransportTuning()
        #: The control stream, chosen once: authenticated records over TCP (connect-back),
        #: else plain frames on the local socketpair (``worker_transport``).
        self.stream = ChannelStream(sock, channel) if channel is not None else InlineStream(sock)
        self.bell = shm_mod.Doorbell(bell) if bell is not None else None
        self.runtime = None
        self.region = None
        self.in_slots = []
        self.in_names = ()
        self.described = []
        self.out_views = []  # per slot set: output name -> its slot's view (None: no slot)
        self.next_set = 0  # the set the client publishes its next request in (cyclic order)
        self.state = None  # State, when the stage declares state pairs
        self.fed_names = None  # the input names a run's frame carries (check_feeds)
        self.codec = None  # binary run/result frames for the loaded signature (wire.FastCodec)
        self._plan = None  # (checked descriptor list, how to read its arrays): _fed
        #: The next request as the last binary run's signature makes it (``wire.ExpectedFrame``,
        #: TCP only), read with ``_plan`` (``turn``); and the last result's lane
        #: (``_answer_lean``).
        self._expect = None
        self._out_lane = None
        self.spin = self.stream.spin  # the TCP channel's spin (sockspin), else None
        self.send_lock = threading.Lock()  # one frame at a time on the control stream
        self.pool = None  # concurrent runs (``_concurrent``): their threads, else None
        self.busy = []  # per slot set: the future of its request a thread runs, or None
        self.concurrent = 1

    # ---------------------------------------------------------------- replies
    def send(self, header, arrays=None):
        header = wire.with_generation(header, self.generation)
        with self.send_lock:  # concurrent runs answer from their threads ("Concurrent runs")
            self.stream.send(header, arrays)

    def send_parts(self, parts):
        """Send a frame already encoded (a binary ``result``)."""
        with self.send_lock:
            self.stream.send_parts(parts)

    def recv(self):
        return self.stream.recv(codec=self.codec)

    def check_generation(self, frame):
        """A request for another generation is fatal: it was meant for another worker."""
        gen = frame.header.get(wire.GEN_FIELD)
        if gen != self.generation:
            raise wire.ProtocolError("request %s #%d carries gen %r, this worker is generation %d"
                                     % (frame.op, frame.id, gen, self.generation))

    def send_error(self, rid, exc):
        self.send({"op": "error", "id": rid, "kind": type(exc).__name__,
                   "message": str(exc) or type(exc).__name__,
                   "traceback": traceback.format_exc()})

    # ---------------------------------------------------------------- ops
    def on_load(self, frame):
        options = frame.header.get("options") or {}
        runtime = frame.header["runtime"]
        self.tune(frame.header.get("tuning"))
        self.codec = None
        if runtime == "ort":
            from . import ort_runtime

            self.runtime = ort_runtime.load(frame.header["path"], options)
        elif runtime == "torch":
            from . import torch_runtime

            self.runtime = torch_runtime.load(frame.header["path"], options)
        else:
            raise ValueError("unknown runtime %r (this worker has: ort, torch)" % runtime)
        self.state = State(options["state"], self.runtime) if options.get("state") else None
        self.fed_names = None
        self._plan = self._expect = self._out_lane = None
        try:
            self.codec = wire.FastCodec([d["name"] for d in self.runtime.inputs],
                                        [d["name"] for d in self.runtime.outputs])
        except wire.ProtocolError:  # over 65535 names: the client keeps JSON frames too
            self.codec = None
        self.send({"op": "loaded", "id": frame.id, "inputs": self.runtime.inputs,
                   "outputs": self.runtime.outputs, "info": self.runtime.info})

    def tune(self, doc):
        """Take the ``TransportTuning`` a ``load`` carries (absent: an older client, the
        defaults); a malformed value is a ``ValueError`` naming the field (the load's error).
        The stream and the doorbell take it at once; a region attached later, too."""
        try:
            tuning = TransportTuning.from_wire(doc)
        except ValueError as exc:
            raise ValueError("load: the client's transport tuning is malformed: %s" % exc) from None
        self.tuning = tuning
        self.stream.tune(tuning)
        self.spin = self.stream.spin
        if self.bell is not None and self.bell.policy is None:  # not yet bound to a region
            self.bell.tune(tuning)

    def on_attach(self, frame):
        spec = frame.header["region"]
        slots = spec.get("slots")
        if self.bell is None:
            raise wire.ProtocolError("attach: this worker has no doorbell (connected over TCP)")
        # "bell": "eventfd": two eventfds follow the region's memfd (this side's wake-up, then
        # the client's), and replace the socketpair as the doorbell (shm.Doorbell).
        region, bell_fds = receive_region(self.sock, spec, self.generation, self.tuning)
        n_sets = region.n_sets
        if self.region is not None:  # a resized region replaces the old one
            self.region.close()
            if hasattr(self.runtime, "unbind"):
                self.runtime.unbind()
        self.region = region
        if hasattr(self.runtime, "attach_region"):  # torch-cuda: the region pinned for DMA
            self.runtime.attach_region(region)
        self.bell.bind(self.region, shm_mod.OFF_WORKER_ASLEEP, shm_mod.OFF_CLIENT_ASLEEP,
                       spin=self.bell.worker_spin_seconds)
        self.in_slots = [s for s in slots if s["role"] == "in" and s["set"] == 0]
        self.in_names = tuple(s["name"] for s in self.in_slots)
        self.described = [False] * n_sets  # a set's fixed-shape output descriptors written
        self.next_set = 0
        known = {o["name"]: o for o in self.runtime.outputs}
        for s in slots:
            if s["role"] == "out" and s["name"] not in known:
                for fd in bell_fds or ():
                    os.close(fd)
                raise wire.ProtocolError("attach: slot for unknown output %r" % s["name"])
        if bell_fds:  # the client switches when it reads "attached", after this
            self.bell.use_eventfds(bell_fds[0], bell_fds[1])
        self.out_views = []
        for k in range(n_sets):
            views = {}
            for name, decl in known.items():
                shape = decl["shape"]
                if self.region.has("out", name, k) and all(isinstance(d, int) for d in shape):
                    views[name] = self.region.view(
                        "out", name, wire.dtype_of_tag(decl["dtype"]), tuple(shape), k)
                else:
                    views[name] = None
            self.out_views.append(views)
        self._concurrent(spec.get("concurrent", 1), n_sets)
        info = {"kind": self.region.kind, "bell": self.bell.kind, "concurrent": self.concurrent}
        cuda = getattr(self.runtime, "cuda", None)
        if cuda is not None and isinstance(cuda.info.get("pinned_region"), dict):
            info["pinned_region"] = dict(cuda.info["pinned_region"])  # this region, as registered
        self.send({"op": "attached", "id": frame.id, "info": info})

    def _concurrent(self, want, n_sets):
        """Concurrent runs: up to ``want`` requests of the region's sets computed at once, on
        threads over the one session, where the runtime can (``concurrent_runs``: onnxruntime's
        ``run`` is thread-safe, each set has its own I/O binding) and the stage has no state
        (its calls are ordered by the state). Otherwise one at a time, as before.

        The serve loop still takes requests in the sets' cyclic order, and waits for set k's
        last request to be answered before it looks for set k's next one: a set is never run
        twice at once. Each thread publishes its own set's response and wakes the client
        (``Doorbell.wake``: a ring that decides nothing, safe beside the loop's wait); the
        loop blocks in its waits (a spin would take a CPU the runs want).
        """
        if type(want) is not int or not 1 <= want <= max(1, n_sets):
            raise wire.ProtocolError("attach: concurrent %r is outside 1..%d" % (want, n_sets))
        for busy in self.busy:
            if busy is not None:
                busy.result()
        if self.pool is not None:
            self.pool.shutdown(wait=True)
        self.pool, self.busy, self.concurrent = None, [None] * n_sets, 1
        if want > 1 and getattr(self.runtime, "concurrent_runs", False) and self.state is None:
            import concurrent.futures

            self.pool = concurrent.futures.ThreadPoolExecutor(want, thread_name_prefix="xstage-run")
            self.concurrent = want

    def on_device_slots(self, frame):
        """Device tensors (torch-cuda, ``device_slots.py``): one device slot set per region slot
        set, allocated and exported once; the IPC fields travel as bytes, never pickled."""
        if self.region is None or not hasattr(self.runtime, "open_device_slots"):
            raise ValueError("device slots: the stage needs an attached region and a torch runtime")
        if self.state is not None:
            raise ValueError("device tensors with state pairs are not supported: open the stage "
                             "without --ep-option device_tensors=on")
        info, arrays = self.runtime.open_device_slots(self.region.n_sets)
        self.send({"op": "device_slots_ready", "id": frame.id, "info": info}, arrays)

    def on_evidence(self, frame):
        """What the runtime collected for the proof; the profile travels as a uint8 tensor."""
        if self.runtime is None:
            raise RuntimeError("evidence before load")
        arrays = {}
        text = getattr(self.runtime, "profile_text", None)
        if text is not None:
            arrays[wire.PROFILE_TENSOR] = np.frombuffer(text, dtype=np.uint8)
        info = dict(getattr(self.runtime, "evidence", {}) or {})
        info["memory"] = memory.detail()
        self.send({"op": "evidence_data", "id": frame.id, "info": info}, arrays)
        if (info.get("stage_memory") or {}).get("basis") == "unprofiled":
            # the profile was the proof's: once sent, its bytes go, and later calls' peaks
            # start from what the stage holds (docs/memory.md, "The profiler's memory")
            del arrays, text
            self.runtime.profile_text = None
            memory.release_freed()
            memory.reset_peak()

    def on_state(self, frame):
        """The state the last call left, by state *output* name (the numeric gate compares it
        at every call; serving never reads it)."""
        if self.state is None:
            raise ValueError("state: the stage declares no state pairs")
        values = {out: self.state.values[name] for out, name in self.state.by_output.items()}
        self.send({"op": "state_data", "id": frame.id}, values)

    def on_check_sets(self, frame):
        """The gate's inputs in every slot set, each set's answer against set 0's
        (``set_check``); a stage with state serves in one set and has nothing to check."""
        from .set_check import check_sets

        if self.runtime is None or self.region is None or self.state is not None:
            raise ValueError("check_sets: needs a loaded stage without state and a region")
        feeds = frame.arrays()
        self.check_feeds(feeds)
        info, arrays = check_sets(self.runtime, self.region, self.in_names, self.out_views, feeds)
        self.send({"op": "sets_checked", "id": frame.id, "info": info}, arrays)

    def check_feeds(self, feeds):
        declared = self.fed_names
        if declared is None:  # once per load: the inputs the caller gives (not the state's)
            held = self.state.values if self.state is not None else {}
            declared = self.fed_names = frozenset(
                i["name"] for i in self.runtime.inputs if i["name"] not in held)
        if feeds.keys() != declared:
            raise ValueError("inputs %s do not match the stage's %s"
                             % (sorted(feeds), sorted(declared)))

    def _fed(self, frame):
        """A binary run's inputs, checked (``check_feeds``) once per descriptor list: the codec
        hands back the same checked list for every frame of one signature, and its arrays are
        then read with the plan made from the first (shape, dtype, offset)."""
        tensors = frame.tensors
        plan = self._plan
        if plan is None or tensors is not plan[0]:
            feeds = frame.arrays()
            self.check_feeds(feeds)
            self._plan = self._expect = None
            if all(nbytes for _, _, _, _, nbytes in tensors):
                self._plan = (tensors, tuple(
                    (name, shape, arr.dtype, offset)
                    for (name, _, shape, offset, _), arr in zip(tensors, feeds.values())))
                if self.stream.expects and self.state is None:
                    # the next request of this signature, checked in fewer steps (turn):
                    # this frame passed every check (generation, frame, feeds) to get here
                    self._expect = self.codec.expect(wire.FAST_RUN, self.generation, tensors,
                                                     len(frame.payload))
            return feeds
        return self._planned(frame.payload)

    def _planned(self, payload):
        """The inputs of a binary run's ``payload`` read with ``_fed``'s plan: arrays viewing
        it, as ``Frame.arrays`` makes them."""
        feeds = {}
        for name, shape, dtype, offset in self._plan[1]:
            feeds[name] = np.ndarray(shape, dtype, payload, offset)
        return feeds

    def _answer_lean(self, rid, outputs, worker_ns, rss, peak):
        """A binary result through its signature's lane (``wire.Lane``): the id and the
        timing packed into the kept frame, the outputs copied in, sealed in place. False where
        the outputs take the long way (``encode_fast``). The last lane is kept, and outputs of
        its signature (names in order, numpy arrays, dtypes, shapes: the codec's key) fill it
        at once (``fill_same``), without the codec's lookup."""
        timing = (worker_ns, rss, peak)
        lane = self._out_lane
        try:
            if lane is None or lane.fill_same(rid, outputs, timing) is None:
                lane = self.codec.lane(wire.FAST_RESULT, self.generation, outputs)
                if lane is None:
                    return False
                self._out_lane = lane
                lane.fill(rid, outputs, timing)
        except (ValueError, TypeError, BufferError, struct.error):
            return False
        self.stream.send_lane(lane)
        return True

    def on_run(self, frame):
        if self.runtime is None:
            raise RuntimeError("run before load")
        if frame.fast and self.state is None:  # the common case: a binary run, no state
            self._run_binary(frame.id, self._fed(frame))
            return
        feeds = frame.arrays()
        self.check_feeds(feeds)
        timing = {}
        if self.state is not None:
            if (frame.header.get("options") or {}).get("reset_state"):
                self.state.reset()
            timing["state_reset"] = self.state.fresh
            feeds.update(self.state.values)
        t0 = time.perf_counter_ns()
        outputs = self.runtime.run(feeds)
        worker_ns = time.perf_counter_ns() - t0
        if self.state is not None:
            outputs = self.state.keep(outputs)
        rss, peak = memory.read_cached()  # one getrusage unless a page fault happened
        timing.update(worker_ns=worker_ns, rss=rss, peak=peak)
        if frame.fast:  # a binary run is answered in binary (docs/wire.md)
            parts = wire.encode_fast(self.codec, "result", frame.id, self.generation, outputs,
                                     timing=timing)
            if parts is not None:
                self.send_parts(parts)
                return
        self.send({"op": "result", "id": frame.id, "timing": timing}, outputs)

    def _run_binary(self, rid, feeds):
        """A binary run of a stage without state, its inputs read: run, answer in binary."""
        t0 = time.perf_counter_ns()
        outputs = self.runtime.run(feeds)
        worker_ns = time.perf_counter_ns() - t0
        rss, peak = memory.read_cached()
        if self._answer_lean(rid, outputs, worker_ns, rss, peak):
            return
        timing = {"worker_ns": worker_ns, "rss": rss, "peak": peak}
        parts = wire.encode_fast(self.codec, "result", rid, self.generation, outputs,
                                 timing=timing)
        if parts is not None:
            self.send_parts(parts)
        else:
            self.send({"op": "result", "id": rid, "timing": timing}, outputs)

    def on_shm_call(self, seq, s=0):
        """Serve request ``seq`` published in slot set ``s`` (docs/wire.md, shm.py's table)."""
        region = self.region
        ring = self.bell.wake if self.pool is not None else self.bell.ring
        gen, req_flags = region.request_head(s)
        if gen != self.generation:
            raise wire.ProtocolError("shared-region request #%d carries gen %d, this worker is "
                                     "generation %d" % (seq, gen, self.generation))
        if not region.take(seq, s):  # withdrawn before it started: never run
            region.publish_response(seq, shm_mod.STATUS_CANCELLED, 0, s=s)
            ring()
            return
        out_views = self.out_views[s]
        start = end = flags = 0
        state = self.state
        try:
            if req_flags & shm_mod.FLAG_DEVICE_TENSORS:  # device tensors (docs/torch.md)
                if not hasattr(self.runtime, "run_device"):
                    raise ValueError("a device-tensor request to a worker without device slots")
                start = time.monotonic_ns()
                self.runtime.run_device(s)
                end = time.monotonic_ns()
                rss, peak = memory.read_cached()
                region.publish_response(seq, shm_mod.STATUS_OK, end - start, rss, peak, s,
                                        start, end, 0)
                ring()
                return
            feeds = region.inputs(s, self.in_names)
            if state is not None:
                if req_flags & shm_mod.FLAG_RESET_STATE:
                    state.reset()
                flags = shm_mod.FLAG_STATE_RESET if state.fresh else 0
                feeds.update(state.values)
            start = time.monotonic_ns()  # one clock for both processes (shm.py, "Stamps")
            rest = self.runtime.run_into(feeds, out_views, s)
            end = time.monotonic_ns()
            worker_ns = end - start
            if state is not None:
                rest = state.keep(rest)
            inline = {}
            if not self.described[s]:  # fixed-shape outputs: their descriptors never change
                for name, view in out_views.items():
                    if view is not None:
                        region.describe("out", name, view.shape, view.nbytes, s)
                self.described[s] = True
            for name, value in rest.items():
                value = np.ascontiguousarray(value)
                if not region.write("out", name, value, s):
                    inline[name] = value
            rss, peak = memory.read_cached()
            if inline:
                # Outputs too large for their slots travel inline, all of them at once.
                allout = {}
                for o in self.runtime.outputs:
                    n = o["name"]
                    if state is not None and n in state.by_output:
                        continue
                    allout[n] = inline[n] if n in inline else (
                        rest[n] if n in rest else np.array(out_views[n]))
                timing = {"worker_ns": worker_ns, "rss": rss, "peak": peak}
                if state is not None:
                    timing["state_reset"] = bool(flags)
                self.send({"op": "result", "id": seq, "timing": timing}, allout)
                region.publish_response(seq, shm_mod.STATUS_INLINE, worker_ns, rss, peak, s,
                                        start, end, flags)
            else:
                region.publish_response(seq, shm_mod.STATUS_OK, worker_ns, rss, peak, s,
                                        start, end, flags)
        except Exception as exc:
            self.send_error(seq, exc)
            region.publish_response(seq, shm_mod.STATUS_ERROR, 0, s=s, start_ns=start,
                                    end_ns=end)
        ring()

    def _prefetching(self, ready, k):
        """``ready`` that also hands the runtime each new ``fill`` of set ``k`` while the
        caller copies the request's inputs ("Streamed inputs" in shm.py): the runtime queues
        the DMA of the bytes written so far."""
        fill, prefetch = self.region.fill_check(k), self.runtime.prefetch
        seen = [fill()]

        def check():
            if ready():
                return True
            now = fill()
            if now != seen[0]:
                seen[0] = now
                prefetch(k, now)
            return False

        return check

    # ---------------------------------------------------------------- loop
    def serve(self):
        while True:
            if self.region is not None:
                # Requests come in the sets' cyclic order: wait on the next set only.
                region, k = self.region, self.next_set
                if self.pool is not None and getattr(self.runtime, "settled", True):
                    code = self._serve_concurrent(region, k)
                    if code is not None:
                        return code
                    continue
                ready = region.request_check(region.resp_id(k), k)
                if getattr(self.runtime, "streams_inputs", False):
                    ready = self._prefetching(ready, k)
                state = self.bell.wait(ready, None, watch=(self.sock,),
                                       spin=self.bell.worker_spin_seconds, heads_up=True)
                if state == "ready":
                    self.next_set = (k + 1) % region.n_sets
                    self.on_shm_call(region.req_id(k), k)
                    continue
                if state == "closed":
                    return EXIT_ORPHANED
            code = self.turn()
            if code is not None:
                return code

    def _serve_concurrent(self, region, k):
        """One step of the serve loop with concurrent runs (``_concurrent``): set k's request
        handed to a thread, or one control frame served; the exit status where the worker
        ends, else None."""
        busy = self.busy[k]
        if busy is not None:
            busy.result()  # set k's last request is answered before its next is looked for
            self.busy[k] = None
        state = self.bell.wait(region.request_check(region.resp_id(k), k), None,
                               watch=(self.sock,), spin=0)
        if state == "ready":
            self.next_set = (k + 1) % region.n_sets
            self.busy[k] = self.pool.submit(self.on_shm_call, region.req_id(k), k)
            return None
        if state == "closed":
            return EXIT_ORPHANED
        return self.turn()

    def turn(self):
        """Read and serve one frame of the control stream; the exit status where the worker
        ends, else None.

        The next binary run of the last one's signature (``_expect``, TCP) is checked by the
        channel in fewer steps (its fixed bytes, generation included, its id, counter and
        tag) and run at once; any other frame takes the checks below.
        """
        expect = self._expect
        if expect is not None:
            try:
                frame = self.stream.recv(codec=self.codec, expect=expect)
            except wire.PeerClosed:
                return EXIT_ORPHANED
            if frame is expect:
                if self.spin is not None:
                    self.spin.expected = None  # one record: spin for the next one
                try:
                    self._run_binary(expect.fields[0], self._planned(expect.payload))
                except Exception as exc:
                    self.send_error(expect.fields[0], exc)
                return None
        else:
            try:
                frame = self.recv()
            except wire.PeerClosed:
                return EXIT_ORPHANED
        spin = self.spin
        if spin is not None:
            # After a request larger than one record, wait for the next one blocked: a
            # large transfer takes milliseconds, and a spin saves one wake-up while it
            # takes the CPU the caller's MACs and copies want (as the client does).
            spin.expected = 60.0 if len(frame.payload) > wire.SMALL_FRAME else None
        header = frame.header
        op = header["op"]
        if header.get(wire.GEN_FIELD) != self.generation:
            self.check_generation(frame)  # raises, naming both
        if frame.fast and op == "run":  # the common call: no lookup, no other op's checks
            try:
                self.on_run(frame)
            except Exception as exc:
                self.send_error(frame.id, exc)
            return None
        if op == "shutdown":
            self.send({"op": "bye", "id": frame.id})
            return 0
        if op == "ping":
            info = memory.detail()
            if self.bell is not None and self.bell.policy is not None:
                info["doorbell"] = self.bell.summary()  # the wait policy's decisions
            spin = self.stream.spin
            if spin is not None:  # the TCP channel's spins for the next request
                info["socket_spin"] = spin.summary()
            cuda = getattr(self.runtime, "cuda", None)
            if cuda is not None:  # torch-cuda: the pinned region as it serves now
                info["pinned_region"] = dict(cuda.info["pinned_region"])
            self.send({"op": "pong", "id": frame.id, "info": info})
            return None
        handler = {"load": self.on_load, "attach": self.on_attach, "run": self.on_run,
                   "evidence": self.on_evidence, "device_slots": self.on_device_slots,
                   "state": self.on_state, "check_sets": self.on_check_sets}.get(op)
        try:
            if handler is None:
                raise wire.ProtocolError("op %s is not a request a worker serves" % op)
            handler(frame)
        except Exception as exc:
            self.send_error(frame.id, exc)
        if op == "check_sets":  # its inline inputs were a copy the stage never holds: not a peak
            del frame, header
            memory.release_freed()
            memory.reset_peak()


def hello(secret, nonce=None, generation=1):
    pid = os.getpid()
    versions = {"python": platform.python_version(), "numpy": np.__version__}
    try:
        import onnxruntime

        versions["onnxruntime"] = onnxruntime.__version__
    except Exception:
        pass
    header = {"op": "hello", "id": 0, "gen": generation, "v": PROTOCOL_VERSION, "features": FEATURES,
              "package_hash": package_hash(), "auth": wire.auth_token(secret, pid),
              "worker": {"pid": pid, "executable": sys.executable,
                         "implementation": platform.python_implementation(),
                         "platform": sys.platform, "machine": platform.machine(),
                         "versions": versions}}
    if nonce is not None:
        header["nonce"] = nonce
        header["record_bytes"] = wire.CHUNK_BYTES  # the channel's records, both ways
    return header


def handshake(sock, secret, generation=1):
    """The worker's half of the TCP handshake (docs/security.md); returns the Channel.

    Sends the hello with a fresh nonce, checks the client's proof over both nonces and this
    hello, answers with its own proof; every frame after that is authenticated.
    """
    header = hello(secret, wire.new_nonce(), generation)
    wire.send_frame(sock, header)
    frame = wire.recv_frame(sock, max_payload=0)
    if frame.op != "auth" or frame.id != 0:
        raise wire.ProtocolError("handshake: expected auth #0, the client sent %s #%d"
                                 % (frame.op, frame.id))
    digest = wire.transcript(header, frame.header["nonce"])
    wire.check_proof(secret, "client", digest, frame.header["proof"])
    wire.send_frame(sock, {"op": "auth_ok", "id": 0,
                           "proof": wire.proof(secret, "worker", digest)})
    channel = wire.Channel(sock, secret, digest, "worker")
    channel.chunk_bytes = header["record_bytes"]
    return channel


def main(argv):
    parser = argparse.ArgumentParser(prog="xstage_remote worker")
    parser.add_argument("--ctl-fd", type=int, help="inherited control socket (same kernel)")
    parser.add_argument("--bell-fd", type=int, help="inherited doorbell socket (same kernel)")
    parser.add_argument("--connect", help="host:port to connect back to (across kernels)")
    parser.add_argument("--generation", type=int, default=1,
                        help="this worker's generation (1 for a stage's first worker)")
    args = parser.parse_args(argv)
    stdin = os.fdopen(0, "rb", buffering=0, closefd=False)
    line = b""
    while not line.endswith(b"\n"):
        chunk = stdin.read(1)
        if not chunk:
            break
        line += chunk
    secret = line.strip().decode("ascii", "replace")
    if not secret:
        sys.stderr.write("xstage worker: no secret on stdin; refusing to start\n")
        sys.exit(64)
    threading.Thread(target=_watchdog, args=(0,), daemon=True, name="xstage-watchdog").start()
    if not 1 <= args.generation <= wire.MAX_GENERATION:
        sys.stderr.write("xstage worker: --generation %d is outside [1, 2^32)\n" % args.generation)
        sys.exit(64)
    try:
        if args.connect:
            host, _, port = args.connect.rpartition(":")
            sock = socket.create_connection((host, int(port)), timeout=60)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            channel = handshake(sock, secret, args.generation)  # under the 60 s connect timeout
            sock.settimeout(None)
            # The stream spins for the next request before blocking (sockspin: the shared
            # region's policy), by the defaults until ``load`` brings the client's tuning.
            worker = Worker(sock, None, args.generation, channel)
        else:
            sock = socket.socket(fileno=args.ctl_fd)
            bell = socket.socket(fileno=args.bell_fd) if args.bell_fd is not None else None
            worker = Worker(sock, bell, args.generation)
            worker.send(hello(secret, generation=args.generation))
        code = worker.serve()
    except wire.PeerClosed:
        code = EXIT_ORPHANED
    except (wire.ProtocolError, OSError) as exc:
        sys.stderr.write("xstage worker: %s: %s\n" % (type(exc).__name__, exc))
        code = 65
    shm_mod.write_traces()  # the doorbells of a tuning with wait_trace only
    if code == EXIT_ORPHANED:  # the control stream ended first: the same end as the watchdog's
        _orphaned()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
