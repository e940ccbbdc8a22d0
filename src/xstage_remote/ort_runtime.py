"""The onnxruntime runtime inside a worker: build the session a route asks for, run it.

Session construction here is deliberately literal: the client says which EP (a built-in
provider name with options, or a plugin EP library to register and the device to bind) and
this module asks onnxruntime for exactly that, with its Python fallback turned off where the
build allows, so a session that silently rebuilt itself on the CPU cannot pass unnoticed.
Placement evidence (profiles, assignment) belongs to the ``external`` path and is added there.
"""

import gc
import io
import os
import shutil
import sys
import tempfile
import time

from . import memory

__all__ = ["DEVICE_MEMORY_READERS", "REBUILD_PROFILE_BYTES", "OrtRuntime", "device_memory", "load"]

_ORT_TYPES = {
    "tensor(bool)": "bool", "tensor(int8)": "int8", "tensor(int16)": "int16",
    "tensor(int32)": "int32", "tensor(int64)": "int64", "tensor(uint8)": "uint8",
    "tensor(uint16)": "uint16", "tensor(uint32)": "uint32", "tensor(uint64)": "uint64",
    "tensor(float16)": "float16", "tensor(bfloat16)": "bfloat16", "tensor(float)": "float32",
    "tensor(double)": "float64",
}


def _dims(shape):
    """ORT shapes hold ints, strings (symbolic) or None; symbolic dims become strings."""
    out = []
    for d in shape:
        if isinstance(d, int) and d >= 0:
            out.append(d)
        else:
            out.append(str(d) if d is not None else "?")
    return out


def _signature(args):
    sig = []
    for a in args:
        tag = _ORT_TYPES.get(a.type)
        if tag is None:
            raise TypeError("stage I/O %r has type %s, which the wire cannot carry" % (a.name, a.type))
        sig.append({"name": a.name, "dtype": tag, "shape": _dims(a.shape)})
    return sig


#: The VitisAI EP writes its operator report where this variable points.
EP_REPORT_ENV = {"vitisai": ("XLNX_ONNX_EP_REPORT_FILE", "vitisai_ep_report.json")}


def _bind_plugin(ort, so, ep, plugin, scratch):
    """Register a plugin EP (``plugin_ep``: located, search path, registered), pick its EP
    devices by the route's selector and bind the first with ``add_provider_for_devices``.
    Returns the bound device as data (with the library and onnxruntime version) and the path
    the EP's own report will be written to, or None."""
    from . import plugin_ep

    info = {}
    try:
        if not plugin.get("builtin"):  # a built-in EP (DirectML) has nothing to register
            plugin_ep.register(ort, plugin.get("registration") or ep["name"], library=plugin.get("library"),
                               module=None if plugin.get("library") else plugin.get("module"),
                               dll_dir=bool(plugin.get("dll_dir", True)), info=info)
    except plugin_ep.StepFailed as exc:
        raise RuntimeError("plugin EP %s: %s failed: %s" % (ep["name"], exc.step, exc)) from exc
    select = plugin.get("select") or {}
    found = plugin_ep.matching_devices(ort, ep["name"], select)
    if not found:
        raise RuntimeError("plugin EP %s lists no device matching %s here" % (ep["name"], select))
    report_path = None
    kind = plugin.get("report")
    if kind in EP_REPORT_ENV and scratch is not None:
        var, name = EP_REPORT_ENV[kind]
        report_path = os.path.join(scratch, name)
        os.environ[var] = report_path  # read by the EP when it compiles the session
    so.add_provider_for_devices([found[0][0]], dict(ep.get("options") or {}))
    row = found[0][1]
    bound = {"ep_name": ep["name"], "type": row["device_type"], "vendor": row["device_vendor"],
             "vendor_id": row["device_vendor_id"],
             "device_id": row["device_id"], "ep_metadata": row["ep_metadata"],
             "device_metadata": row["device_metadata"], "library": info.get("library_path"),
             "dll_directory": info.get("dll_directory"), "onnxruntime": ort.__version__,
             "candidates": len(found)}
    return bound, report_path


def _session_options(ort, opts):
    so = ort.SessionOptions()
    if opts.get("intra_op_num_threads"):
        so.intra_op_num_threads = int(opts["intra_op_num_threads"])
    if opts.get("inter_op_num_threads"):
        so.inter_op_num_threads = int(opts["inter_op_num_threads"])
    level = opts.get("graph_optimization_level")
    if level:
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    so.log_severity_level = int(opts.get("log_severity_level", 3))
    # Session config entries pass through as given. (Measured here and left at onnxruntime's
    # default: session.force_spinning_stop=1 slowed a 5.6 ms graph's compute by 3-10%.)
    for key, value in (opts.get("config") or {}).items():
        so.add_session_config_entry(str(key), str(value))
    return so


def _applied_config(session, config):
    """Each session config entry as the session holds it (None where it cannot say)."""
    out = {}
    try:
        held = session.get_session_options()
    except Exception:  # an onnxruntime without the accessor
        return {str(k): None for k in config}
    for key in config:
        try:
            out[str(key)] = held.get_session_config_entry(str(key))
        except Exception:
            out[str(key)] = None
    return out


def _version(text):
    parts = []
    for piece in str(text).split(".")[:3]:
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        parts.append(int(digits or 0))
    return tuple(parts)


class _Tee(io.TextIOBase):
    """Copies what onnxruntime's Python layer prints, so its fallback banner is evidence."""

    def __init__(self, inner):
        self.inner = inner
        self.text = []

    def write(self, s):
        self.text.append(s)
        return self.inner.write(s)

    def flush(self):
        self.inner.flush()


FALLBACK_MARK = "Falling back to"
#: Profiled runs of the warm-up call: the proof's time fraction sums runs 2-4.
PROFILED_RUNS = 4
#: A warm-up profile at least this large makes the worker serve from a second session built
#: without profiling (``OrtRuntime.serve_unprofiled``). onnxruntime's profiler keeps every event
#: it recorded until its session is destroyed (``end_profiling`` writes them, frees none):
#: measured on onnxruntime 1.32, a 20,000-step Scan of two Adds wrote a 206 MiB profile and its
#: session held 654 MiB more than the same session unprofiled (about 3.2x the profile's bytes,
#: docs/memory.md). Under 4 MiB the profiler holds under ~13 MiB, inside the budget's margin.
REBUILD_PROFILE_BYTES = 4 << 20

#: What the runtime's C++ log says when an EP moves work to another device on its own
#: (OpenVINO: "Model compilation failed at OV NPU. Falling back to OV CPU for execution").
_LOG_MARKS = ("falling back", "fallback")


class _StderrCapture(object):
    """Copies what the runtime's C++ layer writes to fd 2 while it compiles or first runs.

    onnxruntime's default logger writes there (the OpenVINO EP's CPU-fallback warning among
    it); the text is passed on to the real stderr (the worker log) afterwards, and the lines
    that speak of a fallback become evidence.
    """

    def __init__(self):
        self.lines = []
        self._saved = None
        self._file = None

    def __enter__(self):
        try:
            sys.stderr.flush()
            self._file = tempfile.TemporaryFile()
            self._saved = os.dup(2)
            os.dup2(self._file.fileno(), 2)
        except (OSError, ValueError):
            self._saved = None
        return self

    def __exit__(self, *exc):
        if self._saved is None:
            return False
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os.dup2(self._saved, 2)
        os.close(self._saved)
        self._file.seek(0)
        data = self._file.read()
        self._file.close()
        if data:
            try:
                os.write(2, data)
            except OSError:
                pass
        text = data.decode("utf-8", "replace")
        self.lines = [ln.strip() for ln in text.splitlines()
                      if any(m in ln.lower() for m in _LOG_MARKS)][:20]
        return False


PROFILE_PREFIX = "xstage-profile-"


def _sweep_stale_profiles():
    """Remove ``$TMPDIR/xstage-profile-<pid>-*`` folders whose worker is gone (it died
    before its first run ended profiling and removed its own). POSIX only: on Windows
    ``os.kill(pid, 0)`` would end the process, not test it."""
    if os.name != "posix":
        return
    root = tempfile.gettempdir()
    try:
        names = os.listdir(root)
    except OSError:
        return
    for entry in names:
        if not entry.startswith(PROFILE_PREFIX):
            continue
        pid = entry[len(PROFILE_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(root, entry), ignore_errors=True)
        except (OSError, OverflowError):
            continue


def load(path, options):
    """``_load`` with a profile folder of its own, removed when the load fails; stale
    folders of dead workers are swept first."""
    tmpdir = None
    if options.get("profile"):
        _sweep_stale_profiles()
        tmpdir = tempfile.mkdtemp(prefix="%s%d-" % (PROFILE_PREFIX, os.getpid()))
    try:
        return _load(path, options, tmpdir)
    except BaseException:
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)
        raise


def _load(path, options, tmpdir):
    """Build a session for ``path`` exactly as ``options`` describe; see OrtRuntime.

    Strict: the requested EP (plus the CPU EP, which onnxruntime needs for what the EP leaves),
    onnxruntime's Python fallback off where the build has the switch (``enable_fallback=0``),
    and what its Python layer prints captured, so a silent rebuild on the CPU by an older build
    is still seen (its "Falling back to [...] and retrying" banner). With ``profile`` the first
    call runs the graph PROFILED_RUNS times, profiled, the node names are the worker's own
    (``onnx_names``: checked, or a renamed copy), and with ORT >= 1.24 the per-node EP
    assignment is recorded.
    """
    import onnxruntime as ort

    from . import onnx_names

    ep = options.get("ep") or {"name": "CPUExecutionProvider"}
    so = _session_options(ort, options.get("session") or {})
    if tmpdir is not None:
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tmpdir, "profile")
    assignment_supported = _version(ort.__version__) >= (1, 24) and hasattr(
        ort.InferenceSession, "get_provider_graph_assignment_info")
    if assignment_supported and options.get("profile"):
        so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    model, names, leftover = path, None, None
    if options.get("profile"):  # node names the worker controls (docs/design.md §5, "Untrusted text")
        in_memory = _version(ort.__version__) >= (1, 24)
        model, names, leftover = onnx_names.prepare(path, in_memory)
        if not isinstance(model, str):
            so.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                        os.path.dirname(os.path.abspath(path)))
    t0 = time.perf_counter()
    plugin = ep.get("plugin")
    try:
        session, bound_device, report_path, printed, log_lines, bind_s = _construct(
            ort, model, so, ep, plugin, tmpdir)
    finally:
        if leftover is not None:  # the session has read it (external data too)
            try:
                os.remove(leftover)
            except OSError:
                pass
    load_s = time.perf_counter() - t0
    evidence = {
        "requested_ep": ep["name"],
        "session_providers": list(session.get_providers()),
        "available_providers": list(ort.get_available_providers()),
        "fallback_banner": printed if FALLBACK_MARK in printed else None,
        "assignment": _assignment(session) if assignment_supported else None,
        "assignment_supported": assignment_supported,
        "bound_device": bound_device,
        "ep_options": dict(ep.get("options") or {}),
        "ep_options_as_applied": _applied_options(session, ep["name"], ep.get("options")),
        "runtime_log": list(log_lines),
        "onnxruntime": ort.__version__,
        "node_names": names,
    }
    runtime = OrtRuntime(ort, session, ep["name"], load_s, bound_device, evidence, tmpdir)
    if plugin:  # of load_s: the plugin EP's registration and device pick, which no cache can skip
        runtime.info["ep_bind_s"] = bind_s
    config = (options.get("session") or {}).get("config")
    if config:  # what the session holds, read back (onnxruntime keeps keys it does not know)
        runtime.info["session_config"] = _applied_config(session, config)
    runtime.ep_report = (plugin or {}).get("report"), report_path
    runtime.memory_reader = options.get("device_memory")  # the route spec's reader, by name
    if tmpdir is not None:
        runtime.source = path, options  # the unprofiled session is built from these (serve_unprofiled)
    return runtime


def _construct(ort, model, so, ep, plugin, scratch):
    """The session itself: the EP bound (a plugin EP registered and its device picked) or
    named, onnxruntime's Python fallback off, and what the runtime prints captured.

    Returns the session, the bound device (plugin EPs), the EP report's path, what the Python
    layer printed, the C++ log's fallback lines and the seconds the binding took.
    """
    bound_device = report_path = None
    bind_s = 0.0
    tee = _Tee(sys.stdout)
    saved, sys.stdout = sys.stdout, tee
    capture = _StderrCapture()
    try:
        capture.__enter__()
        if plugin:
            t0 = time.perf_counter()
            bound_device, report_path = _bind_plugin(ort, so, ep, plugin, scratch)
            bind_s = time.perf_counter() - t0
            session = ort.InferenceSession(model, sess_options=so, enable_fallback=0)
        else:
            providers = [(ep["name"], dict(ep.get("options") or {}))]
            if ep["name"] != "CPUExecutionProvider":
                providers.append(("CPUExecutionProvider", {}))
            session = ort.InferenceSession(model, sess_options=so, providers=providers,
                                           enable_fallback=0)
    finally:
        capture.__exit__(None, None, None)
        sys.stdout = saved
    if hasattr(session, "disable_fallback"):
        session.disable_fallback()
    return session, bound_device, report_path, "".join(tee.text), capture.lines, bind_s


def _applied_options(session, name, given):
    """The EP's options as the session holds them, where it reports them; else as handed over.

    ``get_provider_options()`` answers with the EP's own view for some EPs (CUDA) and an empty
    dict for others (OpenVINO 1.24): then the options the worker applied are what there is.
    """
    try:
        held = dict((session.get_provider_options() or {}).get(name) or {})
    except Exception:  # an old build, or a plugin EP the call does not cover
        held = {}
    return {str(k): str(v) for k, v in (held or dict(given or {})).items()}


def _assignment(session):
    """The per-node plan as plain data: ``[{"ep", "nodes": [{"name", "op_type", "domain"}]}]``."""
    try:
        subgraphs = session.get_provider_graph_assignment_info()
    except Exception as exc:  # the build has the method but not the recording
        return {"error": "%s: %s" % (type(exc).__name__, exc)}
    out = []
    for sg in subgraphs:
        out.append({"ep": sg.ep_name,
                    "nodes": [{"name": n.name, "op_type": n.op_type, "domain": n.domain}
                              for n in sg.get_nodes()]})
    return out


#: The largest EP report the worker reads (a report of a large graph lists every node).
_MAX_REPORT = 16 << 20


def _read_report(kind, path):
    """The EP's own report as written (``text``), or why there is none (``error``)."""
    out = {"kind": kind, "path": path, "text": None}
    if path is None:
        out["error"] = "no scratch folder: the report was not asked for"
        return out
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_REPORT + 1)
    except OSError as exc:
        out["error"] = "the EP wrote no report at %s (%s)" % (path, exc.strerror or exc)
        return out
    if len(data) > _MAX_REPORT:
        out["error"] = "the report is over %d bytes" % _MAX_REPORT
        return out
    out["text"] = data.decode("utf-8", "replace")
    return out


def _nvml_memory():
    from . import nvml

    return nvml.process_memory()


def _dxgi_memory():
    from . import dxgi

    return dxgi.process_memory()


#: The worker's readers of the device memory its own process holds, by the name a route's spec
#: gives (``RouteSpec.device_memory``, sent in ``load``): NVML per process (NVIDIA's GPUs; on
#: another vendor's it says why it has no figure), DXGI's per-process video-memory usage
#: (DirectML). A GPU route with a reader of its own adds it here and names it in its spec.
DEVICE_MEMORY_READERS = {"nvml": _nvml_memory, "dxgi": _dxgi_memory}


def device_memory(reader):
    """This process's device memory as the reader named ``reader`` reports it, else None.

    The ledger charges ``peak`` against the device's pool: the bytes the reader attributes to
    this process after the warm-up, when the EP's arena holds what it grew to. None (no
    reader named, or one this worker lacks) or a ``peak`` of None means no figure (``why``
    says why), so the stage is ``peak_unreported``, never charged a guess.
    """
    read = DEVICE_MEMORY_READERS.get(reader) if reader else None
    if read is None:
        return None
    out = read()
    out["peak"] = out.get("process_used")
    return out


def _unprofiled_session(ort, path, options):
    """The session ``_load`` built, built again from the same file without profiling: the same
    EP, EP options and session options, the plan recorded where the build can."""
    ep = options.get("ep") or {"name": "CPUExecutionProvider"}
    so = _session_options(ort, options.get("session") or {})
    if _version(ort.__version__) >= (1, 24) and hasattr(
            ort.InferenceSession, "get_provider_graph_assignment_info"):
        so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    session, _, _, printed, _, _ = _construct(ort, path, so, ep, ep.get("plugin"), None)
    if FALLBACK_MARK in printed:
        raise RuntimeError("the unprofiled session fell back: %s" % printed.strip()[:300])
    return session


def _plan_shape(assignment):
    """A plan as (EP, op type, domain) counts: node names differ between the renamed copy the
    profiled session ran and the file itself."""
    counts = {}
    for sub in assignment if isinstance(assignment, list) else ():
        for node in sub.get("nodes") or ():
            key = (sub.get("ep"), node.get("op_type"), node.get("domain"))
            counts[key] = counts.get(key, 0) + 1
    return counts


def _check_same_session(session, evidence):
    """The unprofiled session holds the providers, and where recorded the plan, of the proven one.

    Raises:
        RuntimeError: it does not (the stage would serve from a session nothing proved).
    """
    providers = list(session.get_providers())
    if providers != evidence.get("session_providers"):
        raise RuntimeError("the unprofiled session holds %s, the proven one held %s"
                           % (providers, evidence.get("session_providers")))
    proven = evidence.get("assignment")
    if isinstance(proven, list):
        again = _assignment(session)
        if _plan_shape(again) != _plan_shape(proven):
            raise RuntimeError("the unprofiled session's plan differs from the proven one's")


class OrtRuntime:
    """One session, its signature, and two ways to run: by value, or bound to slots."""

    def __init__(self, ort, session, ep_name, load_s, bound_device, evidence, profile_dir):
        self.ort = ort
        self.session = session
        self.evidence = evidence
        self._profile_dir = profile_dir
        self.profile_text = None
        self.inputs = _signature(session.get_inputs())
        self.outputs = _signature(session.get_outputs())
        self._names = [o["name"] for o in self.outputs]  # run's output names, in graph order
        self.info = {
            "runtime": "onnxruntime",
            "onnxruntime": ort.__version__,
            "requested_ep": ep_name,
            "providers": session.get_providers(),
            "load_s": load_s,
            "bound_device": bound_device,
        }
        self._binding = None
        self._bindings = {}  # slot set -> (its io binding, the input shapes it was made for)
        self._memory_read = False
        self.memory_reader = None  # a key of DEVICE_MEMORY_READERS (``load``'s device_memory)
        self.source = None  # (path, load options): a profiled load's, to build it unprofiled

    #: ``run_into`` may run for several slot sets at once (onnxruntime's run is thread-safe,
    #: each set has its own I/O binding): the worker's concurrent runs.
    concurrent_runs = True

    @property
    def settled(self):
        """True once the warm-up's one-time work is done (the profile ended, the session built
        again unprofiled, the memory read): only then may runs overlap."""
        return self._profile_dir is None and self._memory_read

    def run(self, feeds):
        """Outputs by name, in graph order, for inputs by name."""
        names = self._names
        if self._profile_dir is not None:  # the first runs: a compiling EP may compile here
            with _StderrCapture() as capture:
                for _ in range(self._extra_profiled_runs()):
                    self.session.run(names, feeds)
                values = self.session.run(names, feeds)
            self.evidence["runtime_log"] = self.evidence.get("runtime_log", []) + capture.lines
        else:
            values = self.session.run(names, feeds)
        self._after_first_run(feeds)
        return dict(zip(names, values))

    def _extra_profiled_runs(self):
        """Runs before the last profiled one: the proof times runs 2-4 (the first carries start-up)."""
        return PROFILED_RUNS - 1 if self._profile_dir is not None else 0

    def _after_first_run(self, feeds):
        """After the first (warm-up) call: the EP's own operator report read where it writes one
        (its text is evidence), the profiling ended (later calls are not profiled), the stage's
        own peak told apart from the profiler's (``serve_unprofiled``), and the device memory
        read once (GPU EPs)."""
        if self._profile_dir is not None:
            self._end_profiling(feeds)
        if not self._memory_read:
            self._memory_read = True
            device = device_memory(self.memory_reader)
            if device is not None:
                self.evidence["device_memory"] = device

    def _end_profiling(self, feeds):
        kind, report_path = getattr(self, "ep_report", (None, None))
        if kind:
            self.evidence["ep_report"] = _read_report(kind, report_path)
        profiled_peak = memory.read()[1]  # load and the profiled runs, the profiler's events in it
        path = None
        try:
            try:
                path = self.session.end_profiling()
            except Exception as exc:
                self.evidence["profile_error"] = "%s: %s" % (type(exc).__name__, exc)
            size = os.path.getsize(path) if path and os.path.isfile(path) else 0
            # Before the profile is read into memory: its bytes are the proof's, not the stage's.
            self.evidence["stage_memory"] = self.serve_unprofiled(profiled_peak, size, feeds)
            if path is not None:
                try:
                    with open(path, "rb") as f:
                        self.profile_text = f.read()
                except OSError as exc:
                    self.evidence["profile_error"] = "%s: %s" % (type(exc).__name__, exc)
        finally:
            shutil.rmtree(self._profile_dir, ignore_errors=True)
            self._profile_dir = None

    def serve_unprofiled(self, profiled_peak, profile_bytes, feeds):
        """The stage's own peak, apart from the profiler's memory (the record's ``stage_memory``).

        A profile under ``REBUILD_PROFILE_BYTES``: the profiled session serves on, and its peak
        (the profiler's few events in it) is the stage's. A larger one: the profiled session is
        destroyed with its events, the allocator's freed memory handed back, the kernel's
        high-water mark lowered to what is left (``memory.reset_peak``), and a session built from
        the same file with the same EP and options, unprofiled, serves from now on; its load and
        one run of the warm-up's inputs are the stage's peak. That session must hold the same
        providers, and (onnxruntime >= 1.24) the same plan as the proven one, else the warm-up
        fails. Where the OS cannot lower the mark, the peak stays the profiled one.
        """
        out = {"peak": profiled_peak, "profiled_peak": profiled_peak,
               "profile_bytes": profile_bytes, "basis": "profiled"}
        source = getattr(self, "source", None)
        if profile_bytes < REBUILD_PROFILE_BYTES or source is None:
            return out
        self.unbind()
        self.session = None
        gc.collect()  # the profiled session and its events go now
        memory.release_freed()
        lowered = memory.reset_peak()
        session = _unprofiled_session(self.ort, source[0], source[1])
        _check_same_session(session, self.evidence)
        self.session = session
        session.run(self._names, feeds)
        peak = memory.read()[1]
        out["detail"] = memory.detail()
        out.update(peak=peak if lowered else max(peak, profiled_peak), rebuilt=True,
                   basis="unprofiled" if lowered else "profiled (this OS cannot lower its peak)")
        return out

    def run_into(self, feeds, out_views, slot_set=0):
        """Run with inputs read in place and fixed-shape outputs written into ``out_views``.

        ``out_views`` maps output name → a writable numpy view of its slot, or None where
        the shape is data-dependent (then the value comes back as an array to copy).
        ``slot_set`` names the region's slot set the views belong to (one binding each).
        Returns the outputs that were not written in place.
        """
        # A set's slot addresses never move while a region lives, so the set and the shapes
        # key its binding.
        # The binding is this call's own (a local): concurrent runs use other sets' at once.
        key = tuple((n, a.shape) for n, a in feeds.items())
        bound = self._bindings.get(slot_set)
        if bound is None or key != bound[1]:
            binding = self.session.io_binding()
            for name, arr in feeds.items():
                binding.bind_input(name, "cpu", 0, arr.dtype, list(arr.shape),
                                   arr.__array_interface__["data"][0])
            for o in self.outputs:
                view = out_views.get(o["name"])
                if view is not None and view.size:
                    binding.bind_output(o["name"], "cpu", 0, view.dtype, list(view.shape),
                                        view.__array_interface__["data"][0])
                else:
                    binding.bind_output(o["name"], "cpu")
            self._bindings[slot_set] = (binding, key)
        else:
            binding = bound[0]
            # After a run the binding holds the value ORT allocated for each unbound output;
            # a data-dependent one must be unallocated again or the next size is refused.
            for o in self.outputs:
                view = out_views.get(o["name"])
                if view is None or not view.size:
                    binding.bind_output(o["name"], "cpu")
        self._binding = binding
        for _ in range(self._extra_profiled_runs()):
            self.session.run_with_iobinding(binding)
        self.session.run_with_iobinding(binding)
        rest = {}
        values = None
        for i, o in enumerate(self.outputs):
            view = out_views.get(o["name"])
            if view is None or not view.size:
                if values is None:
                    values = binding.get_outputs()
                rest[o["name"]] = values[i].numpy()
        if self._profile_dir is not None or not self._memory_read:
            # nothing here may keep the profiled session alive (serve_unprofiled frees it)
            binding = bound = values = None
            self._after_first_run(feeds)
        return rest

    def unbind(self):
        """Forget the I/O bindings: the slots they point at are gone (a resized region)."""
        self._binding = None
        self._bindings = {}

    def close(self):
        self._binding = None
        self._bindings = {}
        self.session = None
        if self._profile_dir is not None:
            shutil.rmtree(self._profile_dir, ignore_errors=True)
            self._profile_dir = None
