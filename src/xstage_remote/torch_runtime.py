"""The torch runtime: one ``torch.export`` program (``.pt2``) on one torch device, with per-op
placement evidence from its first run. Python 3.9 syntax; needs only torch and numpy.

Loading: ``torch.export.load``; a program is moved to its device with
``torch.export.passes.move_to_device_pass`` where the torch has it (>= 2.5; plain
``.module().to()`` leaves device arguments baked into nodes), and on an older torch (torch 2.4,
which torch-directml pins) by ``move_program``, the same rewrite: parameters, buffers and
constants moved, every ``device=`` argument and ``aten.to.device`` target in every graph
rewritten. torch 2.4 reads the flat archive ``xstage export --for-torch 2.4`` writes, not the
layout of torch >= 2.5 (the error says so). No ``.eval()`` on the loaded module (older builds
reject it).
Option ``float64`` (the numeric gate's tie-break, CPU only): the program's floating
parameters, buffers and constants are widened to float64, so is every float dtype its graph
names (casts, factories, the ``_assert_tensor_metadata`` checks a ``.to(dtype)`` leaves; as
the ONNX tie-break widens its Casts; a ``view(dtype)`` bitcast is left alone), the default
dtype is float64 during the run, and it runs on float64 inputs under a dispatch mode that
fails the call, naming the op, when any op still returns a narrower float (what the
conversion cannot reach).
Inputs are taken by name in the program's own signature order; outputs are named by the
client (the manifest) or ``output_<i>``. A TorchScript file is refused with the remedy.

Evidence: the first (warm-up) run goes through a ``TorchDispatchMode`` that logs every op
with the devices of its tensor inputs and outputs. That works on old torch and on
DirectML, whose profiler sees no device activity. Ops are aggregated by (op, input devices,
output devices) so a large program's log stays small; the client judges it
(``xstage.evidence.prove_torch``). On CUDA the profiler's device kernels are counted too.

Serving on CUDA (``cuda_serving.py``): the shared region pinned for DMA (``attach_region``,
called by the worker when it attaches a region), one stream and one sync per call, and a CUDA
graph captured right after the profiled warm-up, whose replay answers the warm-up call.
"""

import time

import numpy as np

from .formats import is_torchscript

__all__ = ["load", "move_program", "pick_adapter"]


def _dtype_tag(dtype):
    return str(dtype).replace("torch.", "")


#: Higher-order ops a program may hold (control flow): logged themselves, and run through
#: their dense kernel with the mode still on, so the ops inside their branches and bodies log.
_HIGHER_ORDER = ("cond", "while_loop", "map_impl", "scan", "associative_scan")


class _OpLog(object):
    """A TorchDispatchMode that counts ops by (name, input devices, output devices), with the
    time each kind took on the host (a device op's time there is its launch; the device's
    kernel time comes from the profiler)."""

    def __init__(self, torch):
        from torch.utils._python_dispatch import TorchDispatchMode

        counts = {}
        times = {}
        self.counts = counts
        self.times = times

        def devices(obj, out):
            # A 0-d CPU tensor is a scalar a device kernel takes by value (PyTorch allows it
            # next to CUDA tensors; attention returns its RNG seed and offset that way): it
            # says nothing about where the op computed.
            if isinstance(obj, torch.Tensor):
                if not (obj.dim() == 0 and obj.device.type == "cpu"):
                    out.append(str(obj.device))
            elif isinstance(obj, (list, tuple)):
                for o in obj:
                    devices(o, out)
            elif isinstance(obj, dict):
                for o in obj.values():
                    devices(o, out)
            return out

        def note(name, args, kwargs, result, seconds):
            ins = tuple(sorted(set(devices((args, kwargs or {}), []))))
            outs = tuple(sorted(set(devices(result, []))))
            key = (name, ins, outs)
            counts[key] = counts.get(key, 0) + 1
            times[key] = times.get(key, 0.0) + seconds

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                t0 = time.perf_counter()
                result = func(*args, **(kwargs or {}))
                note(str(func.overloadpacket.__name__), args, kwargs, result,
                     time.perf_counter() - t0)
                return result

        self.mode = Mode()
        _register_higher_order(torch, Mode, note)

    def records(self):
        return [{"op": k[0], "in": list(k[1]), "out": list(k[2]), "count": n,
                 "time_us": round(self.times.get(k, 0.0) * 1e6, 3)}
                for k, n in sorted(self.counts.items())]


def _cond_dense(pred, true_fn, false_fn, operands):
    """``cond``'s own dense kernel refuses to run under a mode: take the branch it would."""
    return (true_fn if bool(pred) else false_fn)(*operands)


def _hop_rule(name, dense, note):
    if name == "cond":
        dense = _cond_dense

    def rule(mode, *args, **kwargs):
        t0 = time.perf_counter()
        with mode:
            result = dense(*args, **kwargs)
        note("hop:" + name, args, kwargs, result, time.perf_counter() - t0)
        return result
    return rule


def _register_higher_order(torch, mode_class, note):
    """Teach ``mode_class`` the higher-order ops this torch has (``torch.cond`` otherwise fails
    under a dispatch mode: "no rule registered for HigherOrderOperator cond").

    Each one is logged as ``hop:<name>`` (control flow: not counted, its time contains its
    body's) and run through its dense kernel with the mode pushed again, so every op inside
    its branches, body or mapped function is logged like any other.
    """
    try:
        from torch._C import DispatchKey
    except ImportError:
        return
    for name in _HIGHER_ORDER:
        hop = getattr(torch.ops.higher_order, name, None)
        dense = getattr(hop, "py_kernels", {}).get(DispatchKey.CompositeExplicitAutograd) \
            if hop is not None else None
        if dense is None or mode_class in getattr(hop, "python_key_table", {}):
            continue

        try:
            hop.py_impl(mode_class)(_hop_rule(name, dense, note))
        except Exception:  # an older torch without mode rules for this op: it stays unhandled
            continue


def load(path, options):
    """Load ``path`` for ``options["device"]`` (``cpu``, ``cuda:0``, ``privateuseone:0``…)."""
    import os

    # The CUDA warm-up runs under torch.profiler; unless CUPTI is torn down when it stops, every
    # later eager call pays its callbacks (measured on an H200, torch 2.11: 20 small Linears
    # 2.23x slower after one profiled call, 1.05x with TEARDOWN_CUPTI=1). Set before torch
    # loads kineto; a value the caller's environment sets wins.
    os.environ.setdefault("TEARDOWN_CUPTI", "1")
    import torch

    device_name = options.get("device") or "cpu"
    if is_torchscript(path):
        raise ValueError("%s is a TorchScript file, not a torch.export program: export the "
                         "stage with torch.export (xstage export ... --format pt:fp32)" % path)
    t0 = time.perf_counter()
    try:
        program = torch.export.load(path)
    except Exception as exc:
        raise RuntimeError("torch %s could not load %s (%s): %s: %s"
                           % (torch.__version__, path, _load_hint(path), type(exc).__name__,
                              exc)) from exc
    ignored = _unknown_arguments(torch, path)
    device = _device(torch, device_name, options)
    if options.get("fp32_strict") and device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    moved = "not needed"
    weights = {str(t.device) for t in program.state_dict.values()} | \
        {str(t.device) for t in getattr(program, "constants", {}).values() if hasattr(t, "device")}
    on_target = all(w == str(device) or w.split(":")[0] == device.type == "cpu"
                    or (w == device.type and (device.index or 0) == 0) for w in weights)
    if weights and on_target:
        # Exported on this device already: moving would also rewrite the program's own
        # explicit .to(...) calls, hiding exactly the detours the evidence must see.
        moved = "exported on the device" if device.type != "cpu" else "not needed"
    elif weights:
        try:
            from torch.export.passes import move_to_device_pass
        except ImportError:
            move_to_device_pass = None
        if move_to_device_pass is not None:
            program = move_to_device_pass(program, device)
            moved = "move_to_device_pass"
        else:  # torch < 2.5 (torch-directml's 2.4.1): the same rewrite, done here
            moved = "move_program (%d device arguments rewritten)" % move_program(
                torch, program, device)
    module = program.module()
    if options.get("float64"):
        if device.type != "cpu":
            raise ValueError("the float64 evaluation runs on cpu only, not %s" % device)
        _widen(torch, module)
    runtime = TorchRuntime(torch, program, module, device, time.perf_counter() - t0, moved,
                           options.get("output_names"), bool(options.get("profile")))
    if device.type == "cuda" and not options.get("float64"):
        from .cuda_serving import CudaServing, switch

        runtime.cuda = CudaServing(torch, device,
                                   graphs=switch(options.get("cuda_graphs"), "cuda_graphs"),
                                   pinned=switch(options.get("pinned_region"), "pinned_region"),
                                   device_tensors=switch(options.get("device_tensors", "off"),
                                                         "device_tensors"))
        runtime.info["accelerator"] = runtime.cuda.info
        runtime.cuda.info["cupti_teardown"] = os.environ.get("TEARDOWN_CUPTI")
    if ignored is not None:
        runtime.info["archive"] = runtime.evidence["archive"] = "flat (torch 2.4 layout)"
        runtime.info["ignored_arguments"] = ignored
    if options.get("float64"):
        runtime.float64 = True
        for spec in runtime.outputs:
            if spec["dtype"] in _NARROW:
                spec["dtype"] = "float64"
    return runtime


def _load_hint(path):
    """Which archive layout ``path`` has, and which torch reads it."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except (zipfile.BadZipFile, OSError):
        return "not a zip archive"
    if "serialized_exported_program.json" in names:
        return ("the flat archive torch 2.4 reads, as `xstage export --for-torch 2.4` writes it; "
                "torch >= 2.5 reads only its own layout: see docs/torch.md")
    if any(n.endswith("/archive_format") for n in names):
        return ("the archive layout of torch >= 2.5; for a torch 2.4 worker (torch-directml) "
                "export it with `xstage export ... --for-torch 2.4`: see docs/torch.md")
    return "a .pt2 saved by another torch version may not load: see docs/torch.md"


#: Arguments a newer op schema added that only narrow an assertion: a torch whose schema lacks
#: them checks less, computes the same. Any other argument it lacks refuses the load.
_ASSERT_ONLY = {("_assert_tensor_metadata", "device"), ("_assert_tensor_metadata", "layout")}


def _unknown_arguments(torch, path):
    """For the flat archive torch 2.4 reads: the arguments its deserializer would drop.

    torch 2.4 rebuilds each call from its own op schema and silently drops an argument the
    schema does not name; a newer exporter may have set one (an op that gained a keyword).
    Each node's arguments are checked against this torch's schema of its op: an assertion's
    extra checks (``_ASSERT_ONLY``) are listed and ignored, anything else is an error naming
    the op and the argument. None for any other archive (its deserializer is the exporter's).
    """
    import json
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            if "serialized_exported_program.json" not in z.namelist():
                return None
            doc = json.loads(z.read("serialized_exported_program.json").decode("utf-8"))
    except (zipfile.BadZipFile, OSError, ValueError):
        return None
    ignored, refused = {}, {}

    def graphs(module):
        yield module["graph"]
        for sub in module["graph"].get("nodes", ()):
            for arg in sub.get("inputs", ()):
                graph = (arg.get("arg") or {}).get("as_graph")
                if graph:
                    yield from graphs(graph)

    for graph in graphs(doc["graph_module"]):
        for node in graph.get("nodes", ()):
            target = node.get("target", "")
            parts = target.split(".")
            if len(parts) != 5 or parts[:2] != ["torch", "ops"]:
                continue  # a higher-order op or a Python callable: no op schema to check
            try:
                op = getattr(getattr(getattr(torch.ops, parts[2]), parts[3]), parts[4])
                names = {a.name for a in op._schema.arguments}
            except (AttributeError, RuntimeError):
                continue  # an op this torch lacks: its deserializer has already failed on it
            for given in node.get("inputs", ()):
                name = given.get("name")
                if name in names or not name or "as_none" in (given.get("arg") or {}):
                    continue
                key = "%s.%s(%s)" % (parts[2], parts[3] + "." + parts[4], name)
                book = ignored if (parts[3], name) in _ASSERT_ONLY else refused
                book[key] = book.get(key, 0) + 1
    if refused:
        raise RuntimeError(
            "torch %s's op schemas lack arguments the program sets, which its loader would "
            "drop: %s; the program cannot run on this torch as exported"
            % (torch.__version__, ", ".join("%s x%d" % kv for kv in sorted(refused.items()))))
    return ["%s x%d" % kv for kv in sorted(ignored.items())]


def move_program(torch, program, device):
    """``program`` moved to ``device`` in place, for a torch without ``move_to_device_pass``.

    What that pass does (torch >= 2.5), written for torch 2.4: parameters (kept parameters),
    buffers, tensor constants and example inputs are moved; in every graph module, each node's
    ``device=`` keyword and ``aten.to.device``'s device argument are rewritten; so is the
    device of each node's example value where torch can move it (a fake tensor that cannot
    keeps its old device: the runtime reads only its dtype and shape). Returns how many
    device arguments were rewritten.
    """
    target = str(device)

    def move(t):
        return t.to(device) if isinstance(t, torch.Tensor) else t

    state = program._state_dict
    for key, value in list(state.items()):
        if isinstance(value, torch.nn.Parameter):
            state[key] = torch.nn.Parameter(value.detach().to(device), value.requires_grad)
        elif isinstance(value, torch.Tensor):
            state[key] = value.to(device)
    constants = program._constants
    for key, value in list(constants.items()):
        constants[key] = move(value)
    examples = getattr(program, "_example_inputs", None)
    if examples is not None:
        import torch.utils._pytree as pytree

        program._example_inputs = pytree.tree_map(move, examples)
    rewritten = 0
    to_device = getattr(torch.ops.aten.to, "device", None)
    for sub in program.graph_module.modules():
        if not isinstance(sub, torch.fx.GraphModule):
            continue
        for node in sub.graph.nodes:
            if "device" in node.kwargs:
                kwargs = dict(node.kwargs)
                kwargs["device"] = torch.device(target)
                node.kwargs = kwargs
                rewritten += 1
            if node.op == "call_function" and node.target is to_device and len(node.args) > 1:
                args = list(node.args)
                args[1] = torch.device(target)
                node.args = tuple(args)
                rewritten += 1
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor):
                try:
                    node.meta["val"] = val.to(device)
                except Exception:  # a fake tensor this torch will not move: shape and dtype stay
                    pass
        sub.recompile()
    return rewritten


_NARROW = ("float32", "float16", "bfloat16")


def _widen(torch, module):
    """Parameters, buffers and every floating tensor a ``get_attr`` node reads (lifted
    constants are plain attributes, which ``.to()`` does not reach) to float64, in place."""
    module.to(torch.float64)
    narrow = (torch.float32, torch.float16, torch.bfloat16)

    def wide(value):
        if isinstance(value, torch.dtype) and value in narrow:
            return torch.float64
        if isinstance(value, (list, tuple)):
            return type(value)(wide(v) for v in value)
        return value

    for sub in module.modules():
        graph = getattr(sub, "graph", None)
        changed = False
        for node in getattr(graph, "nodes", ()):
            if node.op == "call_function" and str(node.target) != "aten.view.dtype":
                args, kwargs = wide(node.args), dict((k, wide(v)) for k, v in node.kwargs.items())
                if args != node.args or kwargs != dict(node.kwargs):
                    node.args, node.kwargs, changed = args, kwargs, True
            if node.op != "get_attr":
                continue
            owner, _, leaf = node.target.rpartition(".")
            holder = sub.get_submodule(owner) if owner else sub
            value = getattr(holder, leaf, None)
            if isinstance(value, torch.Tensor) and value.is_floating_point() \
                    and value.dtype != torch.float64:
                if isinstance(value, torch.nn.Parameter):
                    value.data = value.data.double()
                else:
                    setattr(holder, leaf, value.double())
        if changed:
            sub.recompile()


class _Float64Check(object):
    """A TorchDispatchMode that notes the first op returning a float narrower than float64."""

    def __init__(self, torch):
        from torch.utils._python_dispatch import TorchDispatchMode

        found = []
        self.found = found

        def narrow(obj):
            if isinstance(obj, torch.Tensor):
                return _dtype_tag(obj.dtype) if _dtype_tag(obj.dtype) in _NARROW else None
            if isinstance(obj, (list, tuple)):
                for o in obj:
                    hit = narrow(o)
                    if hit:
                        return hit
            return None

        def note(name, args, kwargs, result, seconds):
            hit = narrow(result)
            if hit and not found:
                found.append((name, hit))

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                result = func(*args, **(kwargs or {}))
                note(str(func.overloadpacket.__name__), args, kwargs, result, 0.0)
                return result

        self.mode = Mode()
        _register_higher_order(torch, Mode, note)


def pick_adapter(names, wanted):
    """The DirectML adapter index whose name matches ``wanted`` (case and spacing aside).

    Never index 0 by default: on a laptop adapter 0 is often the discrete GPU, while the
    stage asked for the integrated one. No match, or two, is an error naming them all.
    """
    norm = " ".join(str(wanted or "").lower().split())
    hits = [i for i, n in enumerate(names) if norm and norm in " ".join(str(n).lower().split())]
    if len(hits) != 1:
        raise RuntimeError("DirectML adapter %r: %s among %s" % (
            wanted, "no match" if not hits else "%d matches" % len(hits), list(names)))
    return hits[0]


def _device(torch, name, options):
    if name.startswith("privateuseone") or options.get("directml"):
        import torch_directml

        names = [torch_directml.device_name(i) for i in range(torch_directml.device_count())]
        return torch_directml.device(pick_adapter(names, options.get("adapter_name")))
    return torch.device(name)


def _gpu_identity(torch, device):
    """Which GPU ran it: name and capability from torch, the driver from nvidia-smi."""
    import subprocess

    props = torch.cuda.get_device_properties(device)
    out = {"gpu": props.name, "capability": "%d.%d" % (props.major, props.minor),
           "gpu_memory_bytes": int(props.total_memory), "driver": None}
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=index,driver_version",
                               "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        for line in done.stdout.splitlines():
            index, _, driver = line.partition(",")
            if index.strip() == str(device.index or 0):
                out["driver"] = driver.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def _device_memory(torch, device):
    """What this process holds on the GPU. ``max_memory_allocated`` is only torch's tensors;
    the CUDA context and the caching allocator's reserve are not in it, so the ledger's
    figure is the process's own use as NVML reports it (``nvml``, the reader the ORT GPU
    workers use), else as nvidia-smi does, else torch's reserve."""
    import os
    import subprocess

    from . import nvml

    out = {"peak_allocated": int(torch.cuda.max_memory_allocated(device)),
           "reserved": int(torch.cuda.memory_reserved(device)),
           "free_total": [int(x) for x in torch.cuda.mem_get_info(device)],
           "process_used": None}
    figure = nvml.process_memory()
    out["nvml"] = figure
    source = "nvml" if figure["process_used"] else None
    out["process_used"] = figure["process_used"]
    if not source:
        try:
            done = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                                   "--format=csv,noheader,nounits"], capture_output=True,
                                  text=True, timeout=20)
            for line in done.stdout.splitlines():
                pid, _, used = line.partition(",")
                if pid.strip() == str(os.getpid()):
                    out["process_used"] = int(float(used.strip())) * (1 << 20)
                    source = "nvidia-smi compute-apps"
        except (OSError, subprocess.SubprocessError, ValueError):
            pass
    out["peak"] = out["process_used"] or out["reserved"] or out["peak_allocated"]
    out["source"] = source or "torch reserved"
    return out


def _spec(value, name):
    return {"name": name, "dtype": _dtype_tag(value.dtype), "shape": [int(d) for d in value.shape]}


class TorchRuntime(object):
    def __init__(self, torch, program, module, device, load_s, moved, output_names, profile):
        self.torch = torch
        self.module = module
        self.device = device
        self._profile = profile
        sig = program.graph_signature
        placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
        self._input_names = list(sig.user_inputs)
        self.inputs = [_spec(placeholders[n].meta["val"], n) for n in self._input_names]
        out_node = [n for n in program.graph.nodes if n.op == "output"][0]
        values = out_node.args[0]
        user = [values[i] for i in range(len(values))][-len(sig.user_outputs):] \
            if sig.user_outputs else []
        names = list(output_names or []) or ["output_%d" % i for i in range(len(user))]
        if len(names) != len(user):
            raise ValueError("the program has %d outputs, the client named %d"
                             % (len(user), len(names)))
        self.outputs = [_spec(v.meta["val"], n) for v, n in zip(user, names)]
        self.info = {"runtime": "torch", "torch": torch.__version__, "device": str(device),
                     "load_s": load_s, "moved": moved, "cuda": getattr(torch.version, "cuda", None),
                     "tf32": (bool(torch.backends.cuda.matmul.allow_tf32),
                              bool(torch.backends.cudnn.allow_tf32))
                     if device.type == "cuda" else None}
        if device.type == "cuda":
            self.info.update(_gpu_identity(torch, device))
        self.evidence = {"runtime": "torch", "torch": torch.__version__, "device": str(device),
                         "target_device_type": device.type, "moved": moved,
                         "cuda": getattr(torch.version, "cuda", None)}
        self.profile_text = None
        self.float64 = False
        self.cuda = None  # CudaServing on a CUDA device (cuda_serving.py)

    def run(self, feeds):
        torch = self.torch
        if self.cuda is not None and not self._profile:
            got = self.cuda.call(self.module, [np.ascontiguousarray(feeds[n])
                                               for n in self._input_names], [])
            return dict((spec["name"], got[i]) for i, spec in enumerate(self.outputs))
        arrays = [np.ascontiguousarray(feeds[n]) for n in self._input_names]
        args = [torch.from_numpy(a).to(self.device) for a in arrays]
        if self.float64:
            return self._run_float64(args)
        with torch.no_grad():
            if self._profile:
                self._profile = False
                result = self._profiled(args)
                if self.cuda is not None:
                    result = self._capture(args, arrays, result)
            else:
                result = self.module(*args)
        values = result if isinstance(result, (list, tuple)) else [result]
        out = {}
        for spec, value in zip(self.outputs, values):
            out[spec["name"]] = value.detach().to("cpu").numpy()
        return out

    def _capture(self, args, arrays, eager):
        """After the profiled eager run: the CUDA graph, and the replay's outputs in the eager
        run's place (the gate judges what serves). The device memory is read again after the
        capture, so the measured peak holds the graph's private pool."""
        replayed = self.cuda.capture(self.module, args, arrays)
        self.evidence["device_memory"] = _device_memory(self.torch, self.device)
        self.evidence["accelerator"] = self.cuda.info
        if replayed is None:
            return eager
        self.cuda.note_eager_difference(
            eager if isinstance(eager, (list, tuple)) else [eager], replayed)
        return replayed

    def attach_region(self, region):
        """The worker's hook when a shared region is attached: pinned for DMA (CUDA only)."""
        if self.cuda is not None:
            self.cuda.attach_region(region)
            self.evidence["accelerator"] = self.cuda.info

    @property
    def streams_inputs(self):
        """Whether the worker should hand this runtime the caller's ``fill`` while it waits
        (a CUDA graph reading a pinned region: ``prefetch``)."""
        return self.cuda is not None and self.cuda.streams_inputs

    def prefetch(self, s, fill):
        """Queue the DMA of set ``s``'s input bytes the caller has written (shm.py's
        "Streamed inputs")."""
        self.cuda.prefetch(s, fill, self._input_names)

    def open_device_slots(self, n_sets):
        """The worker's ``device_slots`` request: the slots' export frame (CUDA only)."""
        if self.cuda is None:
            raise ValueError("device tensors need a torch-cuda stage; this one runs on %s"
                             % self.device)
        return self.cuda.open_device_slots(self.inputs, self.outputs, n_sets)

    def run_device(self, s):
        """A call whose tensors are in set ``s``'s device slots (``FLAG_DEVICE_TENSORS``)."""
        if self.cuda is None:
            raise ValueError("a device-tensor request to a %s worker (no device slots)"
                             % self.device)
        self.cuda.call_device(self.module, s)

    def _run_float64(self, args):
        torch = self.torch
        args = [a.double() if a.is_floating_point() else a for a in args]
        check = _Float64Check(torch)
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            with torch.no_grad(), check.mode:
                result = self.module(*args)
        finally:
            torch.set_default_dtype(default)
        if check.found:
            raise RuntimeError("the program computes %s in %s in its float64 run (a dtype "
                               "hard-coded in the program)" % check.found[0])
        values = result if isinstance(result, (list, tuple)) else [result]
        out = {}
        for spec, value in zip(self.outputs, values):
            if value.is_floating_point() and value.dtype != torch.float64:
                raise RuntimeError("the float64 run returned %s for %s"
                                   % (_dtype_tag(value.dtype), spec["name"]))
            out[spec["name"]] = value.detach().numpy()
        return out

    def run_into(self, feeds, out_views, slot_set=0):
        """The shared-region path: outputs copied into their slots where they fit (on CUDA,
        by DMA from and into the pinned region, on one stream with one sync)."""
        if self.cuda is not None and not self._profile:
            views = [out_views.get(spec["name"]) for spec in self.outputs]
            got = self.cuda.call(self.module, [feeds[n] for n in self._input_names], views,
                                 slot_set)
            return dict((self.outputs[i]["name"], v) for i, v in got.items())
        rest = {}
        for name, value in self.run(feeds).items():
            view = out_views.get(name)
            if view is not None and view.size and view.shape == value.shape \
                    and view.dtype == value.dtype:
                np.copyto(view, value)
            else:
                rest[name] = value
        return rest

    def _profiled(self, args):
        torch = self.torch
        log = _OpLog(torch)
        kernels = None
        if self.device.type == "cuda":
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                with log.mode:
                    result = self.module(*args)
                torch.cuda.synchronize()
            kernels = {"device_kernels": 0, "device_time_us": 0.0}
            by_op = {}  # aten op -> the device time of the kernels it launched (the per-op table)
            for event in prof.key_averages():
                t = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0)
                if t and getattr(event, "device_type", None) is not None \
                        and "CUDA" in str(event.device_type):
                    kernels["device_kernels"] += int(event.count)
                    kernels["device_time_us"] += float(t)
                name = str(getattr(event, "key", ""))
                if t and name.startswith("aten::"):
                    by_op[name[len("aten::"):]] = float(t)
            self.evidence["device_memory"] = _device_memory(torch, self.device)
        else:
            with log.mode:
                result = self.module(*args)
        values = result if isinstance(result, (list, tuple)) else [result]
        ops = log.records()
        if kernels is not None:
            names = [r["op"] for r in ops]
            for r in ops:  # an op logged under one (devices) key only: its device time is its own
                if names.count(r["op"]) == 1 and r["op"] in by_op:
                    r["device_time_us"] = round(by_op[r["op"]], 3)
        self.evidence["ops"] = ops
        self.evidence["output_devices"] = [str(v.device) for v in values]
        self.evidence["kernels"] = kernels
        return result

    def close(self):
        if self.cuda is not None:
            self.cuda.close()
        self.module = None
