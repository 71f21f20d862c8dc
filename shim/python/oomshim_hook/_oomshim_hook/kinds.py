"""What kind of memory fills the device when torch runs out of it: parameters (per model),
gradients, optimizer state (per optimizer), activations and other live tensors, torch's cache;
the phase the program was in (forward and in which module, backward, the optimizer step,
inference, outside any step) and the batch that was running.

Computed once per failure that gets a dump by `kinds(...)`, called from the OOM observer in
this package's __init__.py (in allocator mode, where torch calls no OOM observer, oomshim's
allocator calls it through oomshim.torch before it writes the dump). Nothing here runs per
allocation: the step hooks only remember the models and optimizers they saw (weak references).
The phase and the module come from the failing thread's Python stack at the failure, not from
hooks on every module call.

Nothing it touches outlives the call: the program's frames are read without `f_locals` up to
CPython 3.12 (`_frame_locals`), and every object found is referenced from this call's own
variables only, so the program's `except` that follows frees with its `del` what it would free
without the shim.

Every model and optimizer found is counted, the same way under every launcher and in every phase;
the dump lists the largest and says what the rest hold, names a model held more than once by the
model (never by its layers), and says which kinds a count out of time did not finish.

Never raises into the program; bounded in time (OOMSHIM_KINDS_BUDGET_MS, default 2000).
"""

import os
import sys
import time
import weakref

from . import _library_file

_HERE = os.path.dirname(os.path.abspath(__file__))
_models = weakref.WeakSet()
_optimizers = weakref.WeakSet()
# Models and optimizers a dump lists, at most (every one found is counted).
_MAX_MODELS = 16
_MAX_HOOKS = 8
# The input shape of the model's last forward (seen_forward).
_last_input_shape = None


def _is(obj, cls):
    """isinstance by the object's type alone. isinstance() looks up `obj.__class__` when the type
    does not match, which runs the object's own `__getattribute__`: a deprecated torch object
    warns into the program's stderr, a lazy module imports. Nothing the hook reads of the
    program's objects may run their code."""
    return issubclass(type(obj), cls)


def _plain_dict(obj):
    """`obj.__dict__` when reading it runs none of the object's code (its type keeps object's
    attribute lookup), else None."""
    t = type(obj)
    if t.__getattribute__ is not object.__getattribute__ or issubclass(t, type):
        return None
    d = getattr(obj, "__dict__", None)
    return d if type(d) is dict else None


def _function_code(v):
    """The code of a plain function (or a static or class method's), else None; nothing else is
    asked for a `__code__` (a module's `__getattr__` would run)."""
    if type(v) in (staticmethod, classmethod):
        v = v.__func__
    return v.__code__ if type(v) is _FunctionType else None


_FunctionType = type(_is)


def seen_model(module):
    """The outermost module of a forward pass, as the step hooks found it."""
    try:
        _models.add(module)
    except TypeError:
        pass


def seen_forward(args, tensor):
    """The model's forward just ran on `args`: the shape of its first tensor (of type `tensor`) is
    the batch its backward pass will run (a backward runs on autograd's threads, where no forward
    is on the stack to read it from). Once per model forward, with OOMSHIM_AUTO_STEPS=forward:
    the shape only, no reference kept."""
    global _last_input_shape
    found = None
    try:
        for a in args:
            if _is(a, tensor):
                found = [int(x) for x in a.shape] or None
                break
    except Exception:
        pass
    _last_input_shape = found


def seen_optimizer(optimizer):
    """An optimizer whose step the global post-hook saw (once per step: a set insertion)."""
    try:
        if optimizer is not None:
            _optimizers.add(optimizer)
    except TypeError:
        pass


# A frame's locals. `frame.f_locals` of a function's frame on CPython 3.10-3.12 leaves a dict in
# the frame that holds every local of that moment until the frame returns (the snapshot of
# PyFrame_FastToLocals): a program that catches the OOM in that frame and `del`s its batch would
# free nothing. 3.13's `f_locals` is a view of the frame (PEP 667) and keeps nothing. Up to 3.12
# the locals are read from the frame's own slots, at offsets checked on every frame against two
# fields whose values are known (its code object, and its frame object or globals); a frame that
# does not match, or an interpreter not listed, has no locals to read.
_CO_OPTIMIZED = 0x1


def _slot_layout():
    """Where a frame's local slots are on this interpreter (3.10-3.12, 64-bit, release build), as
    (kind, offsets...), or None."""
    if sys.implementation.name != "cpython" or hasattr(sys, "gettotalrefcount"):
        return None
    import struct

    if struct.calcsize("P") != 8:
        return None
    v = sys.version_info[:2]
    if v == (3, 10):
        # PyFrameObject: f_code at 32, f_globals at 48, f_valuestack at 64 (right after the
        # slots), the slots (f_localsplus) at 352.
        return ("inline", 32, 48, 64, 352)
    if v == (3, 11):
        # PyFrameObject.f_frame at 24 -> _PyInterpreterFrame: f_code at 32, frame_obj at 40,
        # localsplus at 72.
        return ("interpreter", 24, 32, 40, 72)
    if v == (3, 12):
        return ("interpreter", 24, 0, 48, 72)
    return None


_LAYOUT = _slot_layout()


def _slot_names(code):
    """The names of a function frame's slots, in order: locals (arguments first), cells that are
    not arguments (3.11+; 3.10 gives every cell a slot of its own), free variables."""
    if sys.version_info[:2] == (3, 10):
        return code.co_varnames + code.co_cellvars + code.co_freevars
    cells = tuple(n for n in code.co_cellvars if n not in code.co_varnames)
    return code.co_varnames + cells + code.co_freevars


def _frame_locals(frame, only=None):
    """[(name, value)] of `frame`'s bound locals (those named in `only`, when given), without
    leaving anything in the frame. Cells are read through."""
    code = frame.f_code
    if sys.version_info >= (3, 13) or not code.co_flags & _CO_OPTIMIZED:
        # A view (3.13), or the namespace itself (a module's or class body's frame).
        try:
            loc = frame.f_locals
            if only is not None:
                return [(n, loc[n]) for n in only if n in loc]
            return list(loc.items())
        except Exception:
            return []
    if _LAYOUT is None:
        return []
    import ctypes

    def word(addr):
        return ctypes.c_void_p.from_address(addr).value or 0

    names = _slot_names(code)
    base = id(frame)
    if _LAYOUT[0] == "inline":
        _, code_at, globals_at, stack_at, slots_at = _LAYOUT
        slots = base + slots_at
        if (word(base + code_at) != id(code) or word(base + globals_at) != id(frame.f_globals)
                or word(base + stack_at) != slots + 8 * len(names)):
            return []
    else:
        _, interpreter_at, code_at, owner_at, slots_at = _LAYOUT
        interpreter = word(base + interpreter_at)
        if not interpreter or word(interpreter + code_at) != id(code) or word(interpreter + owner_at) != base:
            return []
        slots = interpreter + slots_at
    cells = set(code.co_cellvars) | set(code.co_freevars)
    out = []
    for i, name in enumerate(names):
        if only is not None and name not in only:
            continue
        p = word(slots + 8 * i)
        if not p:
            continue  # unbound
        value = ctypes.cast(p, ctypes.py_object).value
        if name in cells and type(value).__name__ == "cell":
            try:
                value = value.cell_contents
            except ValueError:
                continue
        out.append((name, value))
    return out


def _frame_local(frame, name):
    """One local of `frame` (see _frame_locals), or None."""
    try:
        found = _frame_locals(frame, (name,))
    except Exception:
        return None
    return found[0][1] if found else None


def _code_of(fn):
    """The code object a method or function finally runs (through functools.partial, bound
    methods and decorators that set __wrapped__)."""
    for _ in range(8):
        if fn is None:
            return None
        code = getattr(fn, "__code__", None)
        if code is not None:
            return code
        fn = getattr(fn, "func", None) or getattr(fn, "__func__", None) or getattr(fn, "__wrapped__", None)
    return None


def _module_running(code, deadline):
    """The module of a seen model whose forward is `code`, when exactly one is (the fallback where
    a frame's locals cannot be read)."""
    found = None
    for root in list(_models):
        try:
            for i, (_, m) in enumerate(root.named_modules()):
                if i & 255 == 0 and time.monotonic() > deadline:
                    return None
                if _code_of(getattr(m, "forward", None)) is code:
                    if found is not None and found is not m:
                        return None
                    found = m
        except Exception:
            continue
    return found


class _Out(Exception):
    """The time budget is spent."""


def _own_file(path):
    return os.path.dirname(os.path.abspath(path)) == _HERE if path and not path.startswith("<") else False


def _own_package(frame):
    """A frame of oomshim's package (allocator mode calls the observers from oomshim.torch)."""
    try:
        name = frame.f_globals.get("__name__") or ""
    except Exception:
        return False
    return name == "oomshim" or name.startswith("oomshim.")


def _qualname(obj):
    t = type(obj)
    mod = getattr(t, "__module__", "") or ""
    name = getattr(t, "__qualname__", t.__name__)
    return name, (f"{mod}.{name}" if mod and mod != "builtins" else name)


# The device type whose tensors are counted: the failing allocator's. A test on a machine without
# a GPU sets "cpu" (tests/real_torch_kinds.rs): real torch's modules and storages, where they are.
_DEVICE_TYPE = "cuda"


class _Counter:
    def __init__(self, torch, device, deadline):
        self.torch = torch
        self.device = device
        self.deadline = deadline
        self.seen = set()
        self.ticks = 0

    def tick(self):
        self.ticks += 1
        if self.ticks & 255 == 0 and time.monotonic() > self.deadline:
            raise _Out()

    def check(self):
        """Raises _Out once the budget is spent; once per model or optimizer (reaching one costs
        its own code's time, however few tensors it has)."""
        if time.monotonic() > self.deadline:
            raise _Out()

    def on_device(self, t):
        try:
            d = t.device
            if d.type != _DEVICE_TYPE:
                return False
            return (d.index if d.index is not None else self.device) == self.device
        except Exception:
            return False

    def storage(self, t):
        """(key, bytes) of the storage behind tensor `t`."""
        try:
            s = t.untyped_storage()
            return (s.data_ptr(), int(s.nbytes()))
        except Exception:
            return (t.data_ptr(), int(t.numel()) * int(t.element_size()))

    def claim(self, t):
        """(key, bytes, new) of tensor `t`'s storage, `new` its bytes when not counted before,
        else 0; None when `t` is no tensor on the failing device."""
        self.tick()
        if t is None or not _is(t, self.torch.Tensor) or not self.on_device(t):
            return None
        key, n = self.storage(t)
        if key in self.seen:
            return key, n, 0
        self.seen.add(key)
        return key, n, n

    def count(self, t):
        """Bytes of `t`'s storage not counted before (0 if it was, or if `t` is not on the
        failing device)."""
        found = self.claim(t)
        return found[2] if found else 0


def _find_roots(torch, deadline):
    """nn.Module roots and optimizers: those the hooks saw, else (and also: a second copy of a
    model is never run) every one the garbage collector tracks, bounded in time."""
    import gc

    Module = torch.nn.Module
    Optimizer = getattr(torch.optim, "Optimizer", None)
    modules, optimizers = list(_models), list(_optimizers)
    complete = True
    found_modules = []
    try:
        for i, obj in enumerate(gc.get_objects()):
            if i & 4095 == 0 and time.monotonic() > deadline:
                complete = False
                break
            try:
                if _is(obj, Module):
                    found_modules.append(obj)
                elif Optimizer is not None and _is(obj, Optimizer) and obj not in optimizers:
                    optimizers.append(obj)
            except Exception:
                continue
    except Exception:
        complete = False
    children = set()
    for m in found_modules:
        try:
            for c in getattr(m, "_modules", {}).values():
                if c is not None:
                    children.add(id(c))
        except Exception:
            pass
    known = {id(m) for m in modules}
    for m in found_modules:
        if id(m) not in children and id(m) not in known:
            modules.append(m)
            known.add(id(m))
    return modules, optimizers, complete


def _not_ours(frame):
    """A frame of the program or a library, not of oomshim's hook or package."""
    return not _own_file(frame.f_code.co_filename) and not _own_package(frame)


def _where(frame):
    return {"function": frame.f_code.co_name, "file": frame.f_code.co_filename, "line": frame.f_lineno}


def _frames(frame):
    """`frame` and its callers, innermost first, at most 400 (a runaway recursion's stack is not
    worth the time of a walk at a failure)."""
    depth = 0
    while frame is not None and depth < 400:
        depth += 1
        yield frame
        frame = frame.f_back


def _runs_backward(code, fname):
    """A frame of torch's backward entry points (the program's thread waits in one while
    autograd's threads run the pass)."""
    return code.co_name in ("backward", "_engine_run_backward", "run_backward") and (
        "autograd" in fname or fname.endswith("_tensor.py"))


def _caller_of_backward(torch):
    """The program's line that called the backward pass, from the thread waiting in it: a
    failure on one of autograd's threads has no program frame of its own."""
    try:
        frames = sys._current_frames()
    except Exception:
        return None
    for ident, top in frames.items():
        waits = False
        program = None
        for f in _frames(top):
            code = f.f_code
            fname = code.co_filename
            if _runs_backward(code, fname):
                waits = True
            elif program is None and _not_ours(f) and not _library_file(fname):
                program = _where(f)
        if waits and program is not None:
            return program
    return None


_CHECKPOINT_FILE = os.path.join("torch", "utils", "checkpoint.py")
_AOT_AUTOGRAD = os.path.join("torch", "_functorch", "_aot_autograd") + os.sep


def _compiled_model(owner, Module):
    """The model a torch.compile wrapper (dynamo's `OptimizedModule`) runs, or None."""
    if type(owner).__name__ != "OptimizedModule" or not _is(owner, Module):
        return None
    modules = (_plain_dict(owner) or {}).get("_modules")
    orig = modules.get("_orig_mod") if type(modules) is dict else None
    return orig if _is(orig, Module) else None


def _stack_view(torch, frame, deadline):
    """The phase, modules and frames of the failing thread's stack, innermost first."""
    Module = torch.nn.Module
    Optimizer = getattr(torch.optim, "Optimizer", None)
    inner_module = outer_module = outer_frame = inner_where = None
    in_optimizer = None
    backward = False
    in_loss = False
    # Under activation checkpointing the activations of a pass are recomputed block by block:
    # what is held at a failure is no share of a whole pass's.
    checkpointed = False
    compiled_training = False
    framework_frame = program_frame = None
    for f in _frames(frame):
        code = f.f_code
        fname = code.co_filename
        if _not_ours(f):
            where = _where(f)
            if _library_file(fname):
                if framework_frame is None:
                    framework_frame = where
            elif program_frame is None:
                program_frame = where
            name = code.co_name
            if fname.endswith(_CHECKPOINT_FILE):
                checkpointed = True
            # A loss runs when its frame is inner to every module's forward: a loss function
            # further out called the model (HF Trainer's `compute_loss`), and the model runs.
            if inner_module is None and ("loss" in name.lower()
                                         or name in ("cross_entropy", "nll_loss", "log_softmax")):
                in_loss = True
            if _runs_backward(code, fname):
                backward = True
            if name == "forward" and _AOT_AUTOGRAD in fname:
                # A compiled training graph's forward runs as an autograd Function's, where grad
                # mode is off; the graph saves its activations for the backward all the same.
                compiled_training = True
            if name == "forward" or name == "step" or name.startswith("_call_impl") or name == "_wrapped_call_impl":
                owner = _frame_local(f, "self")
                if owner is None and name == "forward":
                    owner = _module_running(code, deadline)
                if owner is not None:
                    try:
                        compiled = _compiled_model(owner, Module) if name != "forward" else None
                        if compiled is not None:
                            # torch.compile runs the model's whole graph in generated code, with
                            # no module's forward on the stack: the compiled model is the module.
                            if inner_module is None:
                                inner_module = compiled
                            outer_module, outer_frame = compiled, f
                        elif name == "forward" and _is(owner, Module):
                            if inner_module is None:
                                inner_module = owner
                                inner_where = (fname, f.f_lineno)
                                if "Loss" in type(owner).__name__:
                                    in_loss = True
                            outer_module, outer_frame = owner, f
                        elif (Optimizer is not None and _is(owner, Optimizer) and in_optimizer is None
                              and inner_module is None):
                            # A forward inside the step (a closure, as Lightning runs every
                            # training step) is the forward's phase, not the optimizer's.
                            in_optimizer = owner
                    except Exception:
                        pass
    try:
        node = torch._C._current_autograd_node()
        if node is not None:
            backward = True
    except Exception:
        pass
    if not backward and program_frame is None and framework_frame is None:
        # No Python frame at all on a thread Python did not start: one of autograd's engine
        # threads, which run the backward pass of CUDA tensors.
        try:
            import threading

            backward = isinstance(threading.current_thread(), threading._DummyThread)
        except Exception:
            pass
    grad = True
    try:
        grad = bool(torch.is_grad_enabled())
        if getattr(torch, "is_inference_mode_enabled", None) and torch.is_inference_mode_enabled():
            grad = False
    except Exception:
        pass
    grad = grad or compiled_training
    if backward:
        phase = "backward"
    elif in_optimizer is not None:
        phase = "optimizer"
    elif outer_module is not None:
        phase = "forward" if grad else "inference"
    elif program_frame is None and framework_frame is None:
        phase = "unknown"
    else:
        phase = "outside"
    return {
        "phase": phase,
        "inner_module": inner_module,
        "inner_where": inner_where,
        "outer_module": outer_module,
        "outer_frame": outer_frame,
        "optimizer": in_optimizer,
        "in_loss": in_loss,
        "checkpointed": checkpointed,
        "framework_frame": framework_frame,
        "program_frame": program_frame,
    }


def _input_shape(torch, frame):
    """The shape of the first tensor argument of the outermost module's forward."""
    if frame is None:
        return None
    try:
        code = frame.f_code
        n = code.co_argcount + code.co_kwonlyargcount
        names = list(code.co_varnames[1:n])
        if code.co_flags & 0x04:  # *args
            names.append(code.co_varnames[n])
        loc = dict(_frame_locals(frame, tuple(names)))
        for name in names:
            v = loc.get(name)
            if _is(v, (tuple, list)):
                v = next((x for x in v if _is(x, torch.Tensor)), None)
            if _is(v, torch.Tensor) and v.dim() >= 1:
                return [int(x) for x in v.shape]
    except Exception:
        pass
    return None


def _module_path(root, target, deadline):
    if root is None or target is None:
        return None
    if root is target:
        return ""
    try:
        for i, (name, m) in enumerate(root.named_modules()):
            if m is target:
                return name
            if i & 255 == 0 and time.monotonic() > deadline:
                return None
    except Exception:
        pass
    return None


def _forward_progress(root, inner, deadline, input_shape=None):
    """How far the forward pass had come when it failed, by the root model's leaf modules in
    the order they were registered (the order most models run them in): the leaves before the
    failing module, the leaves inside it (1 for a leaf), and the root's leaves in all; and the
    same weighed by each leaf's output size per sample as `_OutputSizes` estimates it from the
    input's shape and the leaves' own sizes (a language model's output layer is then as wide as
    its vocabulary, a CNN's first layers as large as their images). With autograd the
    activations held at the failure are only that share of the pass's; without it only the
    running leaf's input and output are held, so the largest of those (`largest_leaf_io`) against
    the failing module's (`failing_leaf_io`) is what the pass needs more. The batch advice scales
    by them. None when the walk cannot tell (no module, the root itself, out of time)."""
    if root is None or inner is None or root is inner:
        return None
    try:
        before = inside = total = 0
        sizes = _OutputSizes(input_shape)
        e_before = e_inside = 0
        io_failing = io_largest = widest = last = 0
        below = None  # the failing module's own name prefix once reached
        for i, (name, m) in enumerate(root.named_modules()):
            if i & 255 == 0 and time.monotonic() > deadline:
                return None
            if m is inner:
                below = name + "."
            leaf = next(iter(m.children()), None) is None
            if leaf:
                total += 1
                held = sizes.current()
                n = sizes.after(m)
                io_largest = max(io_largest, held + n)
                widest = max(widest, n)
                last = n
                if below is None:
                    before += 1
                    e_before += n
                elif m is inner or name.startswith(below):
                    inside += 1
                    e_inside += n
                    io_failing = max(io_failing, held + n)
        if below is None or total == 0:
            return None
        out = {"leaves_before": before, "leaves_in_module": max(inside, 1), "leaves": total}
        if sizes.known and sizes.total > 0:
            out.update(elements_before=e_before, elements_in_module=e_inside, elements=sizes.total,
                       failing_leaf_io=io_failing, largest_leaf_io=io_largest, widest_leaf_elements=widest,
                       last_leaf_elements=last)
        return out
    except Exception:
        return None


class _OutputSizes:
    """Each leaf module's output size per sample (elements), estimated without running anything:
    from the model input's shape, each leaf applied in turn to the tensor before it, its shape
    (spatial dimensions, channels) changed by what the leaf's own attributes say it does: an
    embedding or a linear layer sets the channels, a strided convolution or a pooling layer
    shrinks the spatial dimensions, a flatten merges them, anything else (norms, activations,
    dropout) keeps them. A leaf whose input channels are not those of the tensor before it reads
    an earlier one (a residual branch's downsampling, attention's output projection after its
    fused input projection): the latest one with those channels. Only attributes in the module's
    own `__dict__` are read; nothing runs."""

    def __init__(self, input_shape):
        self.known = bool(input_shape) and len(input_shape) >= 2
        self.shape = None  # (spatial dims, channels) of the tensor so far
        self.seen = []  # earlier (spatial, channels), latest last, a few
        self.total = 0
        self.input_shape = input_shape

    def _start(self, first):
        shape = [max(int(x), 1) for x in self.input_shape[1:]]
        if _embedding(first):
            return (tuple(shape), 1)  # token ids: every dimension is a position
        if len(shape) >= 3:
            return (tuple(shape[1:]), shape[0])  # N, C, H, W...
        return (tuple(shape[:-1]), shape[-1])

    def _reading(self, channels):
        """The latest tensor with these channels, the current one first."""
        if self.shape[1] == channels:
            return self.shape
        for s in reversed(self.seen):
            if s[1] == channels:
                return s
        return self.shape

    def current(self):
        """The elements per sample of the tensor so far (the next leaf's input), 0 before the
        first leaf."""
        if not self.known or self.shape is None:
            return 0
        return _elements(*self.shape)

    def after(self, m):
        """The leaf's output elements per sample, the tensor after it becoming the current one."""
        if not self.known:
            return 0
        try:
            if self.shape is None:
                self.shape = self._start(m)
            d = _plain_dict(m) or {}
            spatial, channels = self.shape
            if _embedding(m):
                spatial, channels = spatial, _int(d.get("embedding_dim"))
            elif _int(d.get("out_features")) and _int(d.get("in_features")):
                spatial, _ = self._reading(_int(d["in_features"]))
                channels = _int(d["out_features"])
            elif _int(d.get("nf")) and type(m).__name__ == "Conv1D":  # transformers' GPT-2 layers
                weight = (d.get("_parameters") or {}).get("weight")
                if weight is not None and len(weight.shape) == 2:
                    spatial, _ = self._reading(int(weight.shape[0]))
                channels = _int(d["nf"])
            elif _int(d.get("out_channels")) and _int(d.get("in_channels")):
                spatial, _ = self._reading(_int(d["in_channels"]))
                spatial = _strided(spatial, d.get("kernel_size"), d.get("stride"), d.get("padding"),
                                   d.get("dilation"))
                channels = _int(d["out_channels"])
            elif "output_size" in d and type(m).__name__.startswith("Adaptive"):
                want = d["output_size"]
                want = tuple(want) if _is(want, (tuple, list)) else (want,) * len(spatial)
                if len(want) == len(spatial):
                    spatial = tuple(s if w is None else max(int(w), 1) for s, w in zip(spatial, want))
            elif "kernel_size" in d and "stride" in d and "Pool" in type(m).__name__:
                spatial = _strided(spatial, d["kernel_size"], d["stride"] or d["kernel_size"],
                                   d.get("padding", 0), d.get("dilation", 1))
            elif type(m).__name__ == "Flatten" and _int(d.get("start_dim")) == 1:
                spatial, channels = (), _elements(spatial, channels)
            if channels <= 0:
                raise ValueError
            if (spatial, channels) != self.shape:
                self.seen = (self.seen + [self.shape])[-64:]
                self.shape = (spatial, channels)
            n = _elements(spatial, channels)
            if d.get("inplace") is True:
                n = 0  # it writes over its input: no memory of its own
            self.total += n
            return n
        except Exception:
            self.known = False
            return 0


def _elements(spatial, channels):
    """Elements per sample of a tensor of these spatial dimensions and channels."""
    n = channels
    for s in spatial:
        n *= s
    return n


def _embedding(m):
    d = _plain_dict(m) or {}
    return bool(_int(d.get("num_embeddings")) and _int(d.get("embedding_dim")))


def _int(v):
    return int(v) if type(v) is int and v > 0 else 0


def _strided(spatial, kernel, stride, padding, dilation):
    """Spatial dimensions after a convolution or pooling window (PyTorch's formula; a `same`
    padding keeps them, divided by the stride)."""
    n = len(spatial)

    def each(v, default):
        if v is None:
            return (default,) * n
        if type(v) is int:
            return (v,) * n
        return tuple(int(x) for x in v) if len(v) == n else (default,) * n

    k, s, d = each(kernel, 1), each(stride, 1), each(dilation, 1)
    if type(padding) is str:
        return tuple(max(-(-x // si), 1) if padding == "same" else max((x - di * (ki - 1) - 1) // si + 1, 1)
                     for x, ki, si, di in zip(spatial, k, s, d))
    p = each(padding, 0)
    return tuple(max((x + 2 * pi - di * (ki - 1) - 1) // si + 1, 1) for x, ki, si, pi, di in zip(spatial, k, s, p, d))


def _autocast_on(torch):
    """Autocast was on for the failing device's type (a question only: it changes nothing)."""
    try:
        return bool(torch.is_autocast_enabled(_DEVICE_TYPE))
    except TypeError:  # before torch 2.4: CUDA's only
        try:
            return bool(torch.is_autocast_enabled()) if _DEVICE_TYPE == "cuda" else False
        except Exception:
            return False
    except Exception:
        return False


def _program_hooks(models, deadline):
    """Forward hooks of the program's own code on the models' modules (a hook that keeps each
    output is a leak named at the hook, not at the line that called the model)."""
    out = []
    for root in models:
        try:
            for name, m in root.named_modules():
                if time.monotonic() > deadline or len(out) >= _MAX_HOOKS:
                    return out
                hooks = getattr(m, "_forward_hooks", None)
                if not hooks:
                    continue
                for fn in list(hooks.values()):
                    code = _function_code(fn) or _function_code(getattr(fn, "__func__", None)
                                                                if type(fn).__name__ == "method" else None)
                    if code is None or _library_file(code.co_filename) or _own_file(code.co_filename):
                        continue
                    out.append({"function": getattr(fn, "__qualname__", code.co_name), "file": code.co_filename,
                                "line": code.co_firstlineno, "module": name or type(m).__name__})
        except Exception:
            continue
    return out


def _state_counts(c, optimizer):
    """The bytes `c` had not counted yet of each tensor of an optimizer's state (its tensors per
    parameter: Adam's moments, say), one by one: a caller adds each as it comes, so what was
    counted before the budget ran out (`c` raises _Out) is kept."""
    for st in list(getattr(optimizer, "state", {}).values()):
        if _is(st, dict):
            for v in st.values():
                yield c.count(v)


def live(torch, device, budget_ms=50):
    """Memory by kind now, for the live region (`oomshim top`, the exporter): the parameters,
    gradients and optimizer state of the models and optimizers the step hooks saw, and torch's
    allocated and reserved bytes. No garbage-collector walk, no stack, no keepers: called at an
    optimizer step, at most every 10 s (sitecustomize.py), never per allocation; bounded."""
    deadline = time.monotonic() + budget_ms / 1000.0
    s = torch.cuda.memory_stats(device)
    allocated = int(s.get("allocated_bytes.all.current", 0))
    reserved = int(s.get("reserved_bytes.all.current", 0))
    c = _Counter(torch, device, deadline)
    params = grads = state = 0
    complete = True
    try:
        for m in list(_models):
            ps = list(m.parameters())
            for p in ps:
                params += c.count(p)
            for p in ps:
                grads += c.count(getattr(p, "grad", None))
        for o in list(_optimizers):
            for group in getattr(o, "param_groups", []):
                for p in group.get("params", []):
                    params += c.count(p)  # a parameter of no model seen
                    grads += c.count(getattr(p, "grad", None))
            for n in _state_counts(c, o):
                state += n
    except _Out:
        complete = False
    return {
        "complete": complete,
        "torch_allocated_bytes": allocated,
        "torch_reserved_bytes": reserved,
        "parameters_bytes": params,
        "gradients_bytes": grads,
        "optimizer_state_bytes": state,
        "activations_bytes": max(allocated - params - grads - state, 0),
        "cache_bytes": max(reserved - allocated, 0),
        "elapsed_ms": round((time.monotonic() - deadline) * 1000 + budget_ms, 1),
    }


# The search for the containers that keep tensors (`_keepers`): its own time budget, and bounds.
_KEEPERS_MS = 50
_MAX_KEEPERS = 4
_MAX_ELEMENTS = 200_000
_MAX_CODES = 400
# Calls and stores that make a container grow, as the bytecode names them.
_GROWS = {"append", "extend", "insert", "appendleft", "extendleft", "add", "update", "setdefault", "__setitem__"}
_CONTAINERS = (list, dict, tuple, set)


def _is_container(v):
    if _is(v, _CONTAINERS):
        return True
    try:
        import collections

        return _is(v, collections.deque)
    except Exception:
        return False


def _container_word(v):
    for t, word in ((dict, "dict"), (list, "list"), (tuple, "tuple"), (set, "set")):
        if isinstance(v, t):
            return word
    return type(v).__name__


def _held_bytes(torch, c, v, seen, deadline):
    """(bytes, tensors) of the device tensors `v` holds: its elements (a dict's values), and one
    level further for elements that are containers themselves (a list of (loss, logits)
    tuples, a dict of outputs). Storages counted once (`seen`), parameters, gradients and
    optimizer state not at all (the counter saw them first)."""
    total = count = 0
    budget = _MAX_ELEMENTS
    # (container, depth left): an explicit stack, no recursive closure (a function that refers
    # to itself is a reference cycle only the garbage collector frees, with what it touched).
    todo = [(v, 1)]
    try:
        while todo:
            x, depth = todo.pop()
            for e in (x.values() if _is(x, dict) else x):
                budget -= 1
                if budget <= 0 or (budget & 1023 == 0 and time.monotonic() > deadline):
                    return total, count
                if _is(e, torch.Tensor):
                    if not c.on_device(e):
                        continue
                    key, n = c.storage(e)
                    if key in c.seen or key in seen:
                        continue
                    seen.add(key)
                    total += n
                    count += 1
                elif depth and _is_container(e):
                    todo.append((e, depth - 1))
                elif depth and _plain_dict(e) is not None:
                    # An object of plain attributes (a record of a step's outputs).
                    todo.append((_plain_dict(e), 0))
    except Exception:
        pass
    return total, count


def _codes_of(roots, deadline):
    """Every code object reachable from `roots` through their constants (functions and classes
    defined inside), at most _MAX_CODES."""
    out, stack, seen = [], list(roots), set()
    while stack and len(out) < _MAX_CODES and time.monotonic() < deadline:
        code = stack.pop()
        if id(code) in seen:
            continue
        seen.add(id(code))
        out.append(code)
        for const in getattr(code, "co_consts", ()):
            if hasattr(const, "co_code"):
                stack.append(const)
    return out


def _growth_line(name, attribute, codes, deadline):
    """(file, line) of the first instruction in `codes` that grows the container bound to `name`
    (an attribute name when `attribute`): `name.append(...)` and the other growing calls, or
    `name[key] = value`. Read from the bytecode (the source of `python -c` is nowhere to read)."""
    import dis

    loads = ("LOAD_ATTR", "LOAD_METHOD") if attribute else (
        "LOAD_NAME", "LOAD_GLOBAL", "LOAD_FAST", "LOAD_DEREF", "LOAD_CLASSDEREF", "LOAD_FAST_CHECK",
        "LOAD_FAST_AND_CLEAR", "LOAD_FAST_BORROW")
    for n, code in enumerate(codes):
        if n and time.monotonic() > deadline:
            return None  # the first code object (the scope's own) is always read
        try:
            ins = list(dis.get_instructions(code))
        except Exception:
            continue
        for i, x in enumerate(ins):
            if x.opname == "LOAD_FAST_LOAD_FAST" and not attribute:
                # Python 3.13 loads two locals at once (`d[k] = v`): (d, k).
                if not isinstance(x.argval, tuple) or name not in x.argval:
                    continue
            elif x.opname not in loads or x.argval != name:
                continue
            line = getattr(getattr(x, "positions", None), "lineno", None)
            for y in ins[i + 1:i + 12]:
                yline = getattr(getattr(y, "positions", None), "lineno", None)
                if yline is not None and line is not None and yline != line:
                    break
                if y.opname in ("LOAD_ATTR", "LOAD_METHOD") and y.argval in _GROWS:
                    return code.co_filename, line
                if y.opname == "STORE_SUBSCR":
                    return code.co_filename, line
                if y.opname.startswith("STORE_"):
                    break
    return None


def _keepers(torch, c, frame, models, deadline):
    """The containers bound to a name that hold the most device tensors not counted as
    parameters, gradients or optimizer state: the program's own frames' locals on the failing
    stack, the globals of their modules, the plain attributes of `self` in those frames and of the
    models' modules. Each with where it is bound and the first line that grows it, at most
    _MAX_KEEPERS, largest first. A container reached only through another object (a trainer's
    callback list, a closure) is not found."""
    found = []  # (bytes, tensors, word, name, scope, codes, attribute)
    seen = set()
    done = set()
    frames = []
    f = frame
    while f is not None and len(frames) < 64:
        fname = f.f_code.co_filename
        if not _own_file(fname) and not _own_package(f) and not _library_file(fname):
            frames.append(f)
        f = f.f_back
    main = sys.modules.get("__main__")

    def consider(v, name, scope, codes, attribute=False):
        if id(v) in done or not _is_container(v) or time.monotonic() > deadline:
            return
        done.add(id(v))
        n, k = _held_bytes(torch, c, v, seen, deadline)
        if n:
            found.append((n, k, _container_word(v), name, scope, codes, attribute))

    modules = []
    for f in frames:
        g = f.f_globals
        if all(g is not m for m in modules):
            modules.append(g)
    if main is not None and all(main.__dict__ is not m for m in modules):
        modules.append(main.__dict__)
    for f in frames:
        if f.f_code.co_name == "<module>":
            continue
        try:
            local = dict(_frame_locals(f))
        except Exception:
            continue
        for name, v in local.items():
            consider(v, name, f"a local of {f.f_code.co_name}",
                     lambda f=f: _codes_of([f.f_code], time.monotonic() + _KEEPERS_MS / 1000.0))
        owner = local.get("self")
        attributes = _plain_dict(owner) if owner is not None else None
        if attributes is not None:
            cls = type(owner).__name__
            for name, v in list(attributes.items()):
                if not name.startswith("_"):
                    consider(v, name, f"an attribute of {cls}", lambda o=owner: _method_codes(o), True)
    for g in modules:
        mod = g.get("__name__", "?")
        codes = lambda g=g: _module_codes(g, frames)
        for name, v in list(g.items()):
            if not name.startswith("__"):
                consider(v, name, f"a global of {mod}", codes)
    for root in models:
        try:
            for path, m in root.named_modules():
                if time.monotonic() > deadline:
                    break
                for name, v in list(vars(m).items()):
                    if not name.startswith("_") and name != "training":
                        where = f"`{path}`" if path else type(root).__name__
                        consider(v, name, f"an attribute of {type(m).__name__} at {where}",
                                 lambda m=m: _method_codes(m), True)
        except Exception:
            continue
    found.sort(key=lambda x: -x[0])
    out = []
    # The lines get a budget of their own: a slow search for containers leaves them theirs.
    deadline = time.monotonic() + _KEEPERS_MS / 1000.0
    for n, k, word, name, scope, codes, attribute in found[:_MAX_KEEPERS]:
        entry = {"container": word, "name": name, "scope": scope, "bytes": n, "tensors": k}
        try:
            at = _growth_line(name, attribute, codes(), deadline)
        except Exception:
            at = None
        if at:
            entry["file"], entry["line"] = at[0], at[1]
        out.append(entry)
    return out


def _module_codes(g, frames):
    """Code of a module: its frames on the stack (the module's own body among them) and its
    functions, with what they define inside."""
    roots = [f.f_code for f in frames if f.f_globals is g]
    for v in list(g.values())[:2000]:
        code = _function_code(v)
        if code is not None and not _library_file(code.co_filename):
            roots.append(code)
    return _codes_of(roots, time.monotonic() + _KEEPERS_MS / 1000.0)


def _method_codes(obj):
    roots = []
    for cls in type(obj).__mro__[:8]:
        for v in list(vars(cls).values()):
            code = _function_code(v)
            if code is not None and not _library_file(code.co_filename):
                roots.append(code)
    return _codes_of(roots, time.monotonic() + _KEEPERS_MS / 1000.0)


def _describe_module(m, path):
    if m is None:
        return None
    short, full = _qualname(m)
    return {"class": short, "qualified_class": full, "path": path}


# The kinds the walk counts, in the order it counts them: a walk out of time has finished the
# ones before the kind it was counting.
_KINDS = ("parameters", "gradients", "optimizer_state")
# Groups of copies of a model the dump names, at most.
_MAX_DUPLICATES = 8


class _Model:
    """One top-level model as counted: its module, its entry in the dump, its parameters on the
    device, the bytes of their storages (`full`) and the shapes that make two models copies."""

    __slots__ = ("module", "entry", "params", "full", "shapes")

    def __init__(self, module, entry, params=(), full=0, shapes=None):
        self.module, self.entry, self.params, self.full, self.shapes = module, entry, params, full, shapes


def _model_entry(cls_of, nbytes=0, count=0, dtypes=None, training=True):
    short, full = _qualname(cls_of) if cls_of is not None else ("", "")
    return {"class": short, "qualified_class": full, "bytes": nbytes, "tensors": count, "dtypes": dtypes or {},
            "training": training, "grad_bytes": 0}


def _count_model(c, m):
    """A _Model of `m`'s parameters on the device (storages not counted before are its bytes),
    or None when it has none there."""
    params, shapes, keys = [], [], set()
    nbytes = count = full = 0
    dtypes = {}
    for p in m.parameters():
        found = c.claim(p)
        if found is None:
            continue
        key, size, new = found
        params.append(p)
        shapes.append((tuple(int(x) for x in p.shape), str(p.dtype)))
        if key not in keys:
            keys.add(key)
            full += size
        if new:
            nbytes += new
            count += 1
            name = str(p.dtype).replace("torch.", "")
            dtypes[name] = dtypes.get(name, 0) + new
    if not params:
        return None
    entry = _model_entry(m, nbytes, count, dtypes, bool(getattr(m, "training", True)))
    return _Model(m, entry, params, full, tuple(shapes))


def _optimizer_params(torch, c, o):
    """The tensors on the device an optimizer steps."""
    out = []
    for group in getattr(o, "param_groups", []):
        for p in group.get("params", []):
            if _is(p, torch.Tensor) and c.on_device(p):
                out.append(p)
    return out


def _count(c, models, optimizers, running, building):
    """Parameters of every model and optimizer found, then their gradients, then the optimizers'
    state, each kind for all of them before the next (a walk out of time names the kinds it did
    not finish: `short_kinds`). Every model and optimizer is in the totals; the dump lists the
    one running (`running`) and the largest, at most _MAX_MODELS of each, and says how many more
    there are. Also the copies of a model held more than once (_duplicates)."""
    torch = c.torch
    records, opts = [], []
    done = 0
    try:
        for m in models:
            c.check()
            try:
                r = _count_model(c, m)
            except _Out:
                raise
            except Exception:
                continue  # a module half built, or whose own code fails: not one to count
            if r is not None:
                records.append(r)
        for o in optimizers:
            c.check()
            try:
                params = _optimizer_params(torch, c, o)
            except Exception:
                continue
            short, full = _qualname(o)
            entry = {"class": short, "qualified_class": full, "bytes": 0,
                     "param_bytes": sum(c.storage(p)[1] for p in params)}
            opts.append((o, entry))
            loose = [p for p in params if c.storage(p)[0] not in c.seen]
            n = sum(c.count(p) for p in loose)
            if n:
                # Parameters of no model found: parameters all the same.
                records.append(_Model(None, dict(_model_entry(None, n), **{
                    "class": f"(parameters of {short} outside any model)"}), loose))
        done = 1
        for r in records:
            c.check()
            g = sum(c.count(getattr(p, "grad", None)) for p in r.params)
            r.entry["grad_bytes"] = g
        done = 2
        for o, entry in opts:
            c.check()
            for n in _state_counts(c, o):
                entry["bytes"] += n
        done = 3
    except _Out:
        pass
    records.sort(key=lambda r: (r.module is None or r.module is not running, -r.entry["bytes"]))
    listed = records[:_MAX_MODELS]
    groups = _duplicates(records, building, c.deadline) if done else []
    for group in groups:
        # Each listed copy after the first listed one points at it (what older readers read).
        first = next((i for i, r in enumerate(listed) if r in group), None)
        for i, r in enumerate(listed):
            if first is not None and i > first and r in group:
                r.entry["duplicate_of"] = first
    opts.sort(key=lambda x: -x[1]["bytes"])
    out = {
        "parameters_bytes": sum(r.entry["bytes"] for r in records),
        "gradients_bytes": sum(r.entry["grad_bytes"] for r in records),
        "optimizer_state_bytes": sum(e["bytes"] for _, e in opts),
        "models": [r.entry for r in listed],
        "more_models": len(records) - len(listed),
        "more_models_bytes": sum(r.entry["bytes"] for r in records[_MAX_MODELS:]),
        "optimizers": [e for _, e in opts[:_MAX_MODELS]],
        "more_optimizers": max(len(opts) - _MAX_MODELS, 0),
        "more_optimizers_bytes": sum(e["bytes"] for _, e in opts[_MAX_MODELS:]),
        "duplicates": [{"class": g[0].entry["class"], "qualified_class": g[0].entry["qualified_class"],
                        "copies": len(g), "bytes_each": g[0].full} for g in groups],
        "short_kinds": list(_KINDS[done:]),
        # Popped by the caller: the listed models' modules (never into the dump).
        "_listed": [r.module for r in listed if r.module is not None],
    }
    return out


def _building(torch, frame):
    """The modules the failing thread was building or moving (the `self` of a module's
    `__init__` or `_apply` on its stack), by id, and the classes being constructed: a model built
    layer by layer fails with its finished layers still loose, each a top-level module that is no
    copy of a model."""
    Module = torch.nn.Module
    ids, classes = set(), set()
    for f in _frames(frame):
        name = f.f_code.co_name
        if name in ("__init__", "_apply"):
            owner = _frame_local(f, "self")
            if owner is not None and _is(owner, Module):
                ids.add(id(owner))
                if name == "__init__":
                    classes.add(type(owner))
    return ids, classes


def _duplicates(records, building, deadline):
    """Groups of top-level models held more than once: two or more of one class with the same
    parameter shapes and dtypes, none sharing a storage with another (a model that shares its
    encoder with another is no copy of it), the most bytes first. Not a group: modules being
    built (their finished layers are loose until the model holds them, see _building), nor
    modules of a class that is a repeated layer of another model found (loose layers)."""
    ids, classes = building
    groups = {}
    for r in records:
        m = r.module
        if m is None or not r.full or r.entry["bytes"] != r.full or id(m) in ids or type(m) in classes:
            continue
        groups.setdefault((type(m), r.shapes), []).append(r)
    out = []
    for (cls, _), members in groups.items():
        if len(members) > 1 and not _repeated_layer(cls, records, members, deadline):
            out.append(members)
    out.sort(key=lambda g: -len(g) * g[0].full)
    return out[:_MAX_DUPLICATES]


def _repeated_layer(cls, records, members, deadline):
    """Whether another model found holds two or more modules of class `cls` (a layer it repeats);
    True too when there is no time left to tell (no group is named then)."""
    inside = {id(r) for r in members}
    for r in records:
        if r.module is None or id(r) in inside:
            continue
        n = 0
        try:
            for i, (_, sub) in enumerate(r.module.named_modules()):
                if i & 255 == 0 and time.monotonic() > deadline:
                    return True
                if type(sub) is cls:
                    n += 1
                    if n > 1:
                        return True
        except Exception:
            continue
    return False


def _largest_first(models, listed):
    """`models` with the listed ones (the running model, then the largest) first."""
    ids = {id(m) for m in listed}
    return list(listed) + [m for m in models if id(m) not in ids]


def kinds(torch, device, request_bytes, frame=None, budget_ms=None):
    """The account of memory by kind on `device` at this failure, as a dict for the dump's
    framework account (`kinds`), or None when it cannot be had."""
    start = time.monotonic()
    if budget_ms is None:
        try:
            budget_ms = int(os.environ.get("OOMSHIM_KINDS_BUDGET_MS", "2000"))
        except ValueError:
            budget_ms = 2000
    deadline = start + max(budget_ms, 1) / 1000.0
    if frame is None:
        frame = sys._getframe(1)
    out = {"complete": True}
    try:
        s = torch.cuda.memory_stats(device)
        allocated = int(s.get("allocated_bytes.all.current", 0))
        reserved = int(s.get("reserved_bytes.all.current", 0))
    except Exception:
        allocated = reserved = None
    out["torch_allocated_bytes"] = allocated
    out["torch_reserved_bytes"] = reserved
    view = _stack_view(torch, frame, deadline)
    c = _Counter(torch, device, deadline)
    models, optimizers, complete = _find_roots(torch, deadline)
    out["complete"] = complete
    # A model the stack shows first, then the ones the hooks saw, then the rest.
    outer = view["outer_module"]
    if outer is not None:
        top = next((m for m in models if m is outer or _module_path(m, outer, deadline) is not None), outer)
        models = [top] + [m for m in models if m is not top]
    counted = _count(c, models, optimizers, models[0] if outer is not None else None, _building(torch, frame))
    if not complete:
        # Models and optimizers the walk did not reach are in no kind.
        counted["short_kinds"] = list(_KINDS)
    counted["complete"] = complete and not counted["short_kinds"]
    out.update(counted)
    param_total = out["parameters_bytes"]
    grad_total = out["gradients_bytes"]
    state_total = out["optimizer_state_bytes"]
    if allocated is not None:
        out["activations_bytes"] = max(allocated - param_total - grad_total - state_total, 0)
    if allocated is not None and reserved is not None:
        out["cache_bytes"] = max(reserved - allocated, 0)
    out["phase"] = view["phase"]
    inner, outer = view["inner_module"], view["outer_module"]
    root = models[0] if models else outer
    out["module"] = _describe_module(inner, _module_path(root, inner, deadline))
    if out["module"] and view["inner_where"]:
        out["module"]["file"], out["module"]["line"] = view["inner_where"]
    out["outer_module"] = _describe_module(outer, _module_path(root, outer, deadline))
    shape = _input_shape(torch, view["outer_frame"])
    if not shape and view["phase"] == "backward":
        shape = _last_input_shape
    if view["phase"] in ("forward", "inference") and not view["in_loss"] and not view["checkpointed"]:
        progress = _forward_progress(root, inner, deadline, shape)
        if progress:
            out["forward_progress"] = progress
    if shape:
        out["input_shape"] = shape
        out["batch"] = shape[0]
    out["in_loss"] = view["in_loss"]
    out["autocast"] = _autocast_on(torch)
    if view["framework_frame"]:
        out["framework_frame"] = view["framework_frame"]
    program_frame = view["program_frame"]
    if program_frame is None and view["phase"] == "backward":
        program_frame = _caller_of_backward(torch)
    if program_frame:
        out["program_frame"] = program_frame
    if view["optimizer"] is not None:
        out["step_optimizer"] = _qualname(view["optimizer"])[0]
    searched = _largest_first(models, out.pop("_listed"))[:_MAX_MODELS]
    hooks = _program_hooks(searched, deadline)
    if hooks:
        out["forward_hooks"] = hooks
    try:
        keepers = _keepers(torch, c, frame, searched,
                           min(deadline, time.monotonic() + _KEEPERS_MS / 1000.0))
    except Exception:
        keepers = None
    if keepers:
        out["keepers"] = keepers
    out["found_by"] = "hooks" if (_models or _optimizers) else "gc"
    out["request_bytes"] = int(request_bytes) if request_bytes is not None else None
    out["elapsed_ms"] = round((time.monotonic() - start) * 1000, 1)
    return out
