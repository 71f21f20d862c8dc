"""What kind of memory fills the device when torch runs out of it: parameters (per model),
gradients, optimizer state (per optimizer), activations and other live tensors, torch's cache;
the phase the program was in (forward and in which module, backward, the optimizer step,
inference, outside any step) and the batch that was running.

Computed once per failure by `kinds(...)`, called from the OOM observer in sitecustomize.py (in
allocator mode, where torch calls no OOM observer, oomshim's allocator calls it through
oomshim.torch before it writes the dump). Nothing here runs per allocation: the step hooks only
remember the models and optimizers they saw (weak references). The phase and the module come
from the failing thread's Python stack at the failure, not from hooks on every module call.

Never raises into the program; bounded in time (OOMSHIM_KINDS_BUDGET_MS, default 2000).
"""

import os
import sys
import time
import weakref

_HERE = os.path.dirname(os.path.abspath(__file__))
_models = weakref.WeakSet()
_optimizers = weakref.WeakSet()
_MAX_MODELS = 16
_MAX_HOOKS = 8
# The input shape of the model's last forward (seen_forward).
_last_input_shape = None


def seen_model(module):
    """The outermost module of a forward pass, as the step hooks found it."""
    try:
        _models.add(module)
    except TypeError:
        pass


def seen_forward(args):
    """The model's forward just ran on `args`: the shape of its first tensor is the batch its
    backward pass will run (a backward runs on autograd's threads, where no forward is on the
    stack to read it from). Once per model forward: the shape only, no reference kept."""
    global _last_input_shape
    found = None
    try:
        for a in args:
            shape = getattr(a, "shape", None)
            if shape is not None and hasattr(a, "dim"):
                found = [int(x) for x in shape] or None
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


class _Out(Exception):
    """The time budget is spent."""


def _library_file(path):
    return ("/site-packages/" in path or "/dist-packages/" in path or path.startswith("<frozen")
            or any(part.startswith(("python3.", "python2.")) for part in path.split("/")))


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

    def on_device(self, t):
        try:
            d = t.device
            if d.type != "cuda":
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

    def count(self, t):
        """Bytes of `t`'s storage not counted before (0 if it was, or if `t` is not on the
        failing device)."""
        self.tick()
        if t is None or not isinstance(t, self.torch.Tensor) or not self.on_device(t):
            return 0
        key, n = self.storage(t)
        if key in self.seen:
            return 0
        self.seen.add(key)
        return n


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
                if isinstance(obj, Module):
                    found_modules.append(obj)
                elif Optimizer is not None and isinstance(obj, Optimizer) and obj not in optimizers:
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
    for ident, f in frames.items():
        waits = False
        program = None
        depth = 0
        while f is not None and depth < 400:
            depth += 1
            code = f.f_code
            fname = code.co_filename
            if _runs_backward(code, fname):
                waits = True
            elif program is None and _not_ours(f) and not _library_file(fname):
                program = _where(f)
            f = f.f_back
        if waits and program is not None:
            return program
    return None


def _stack_view(torch, frame):
    """The phase, modules and frames of the failing thread's stack, innermost first."""
    Module = torch.nn.Module
    Optimizer = getattr(torch.optim, "Optimizer", None)
    inner_module = outer_module = outer_frame = inner_where = None
    in_optimizer = None
    backward = False
    in_loss = False
    framework_frame = program_frame = None
    f = frame
    depth = 0
    while f is not None and depth < 400:
        depth += 1
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
            if "loss" in name.lower() or name in ("cross_entropy", "nll_loss", "log_softmax"):
                in_loss = True
            if _runs_backward(code, fname):
                backward = True
            if name == "forward" or name == "step" or name.startswith("_call_impl") or name == "_wrapped_call_impl":
                try:
                    owner = f.f_locals.get("self")
                except Exception:
                    owner = None
                if owner is not None:
                    try:
                        if name == "forward" and isinstance(owner, Module):
                            if inner_module is None:
                                inner_module = owner
                                inner_where = (fname, f.f_lineno)
                            outer_module, outer_frame = owner, f
                            if "Loss" in type(owner).__name__:
                                in_loss = True
                        elif Optimizer is not None and isinstance(owner, Optimizer) and in_optimizer is None:
                            in_optimizer = owner
                    except Exception:
                        pass
        f = f.f_back
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
        "framework_frame": framework_frame,
        "program_frame": program_frame,
    }


def _input_shape(torch, frame):
    """The shape of the first tensor argument of the outermost module's forward."""
    if frame is None:
        return None
    try:
        code = frame.f_code
        loc = frame.f_locals
        n = code.co_argcount + code.co_kwonlyargcount
        names = list(code.co_varnames[1:n])
        if code.co_flags & 0x04:  # *args
            names.append(code.co_varnames[n])
        for name in names:
            v = loc.get(name)
            if isinstance(v, (tuple, list)):
                v = next((x for x in v if isinstance(x, torch.Tensor)), None)
            if isinstance(v, torch.Tensor) and v.dim() >= 1:
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
                    code = getattr(fn, "__code__", None) or getattr(getattr(fn, "__func__", None), "__code__", None)
                    if code is None or _library_file(code.co_filename) or _own_file(code.co_filename):
                        continue
                    out.append({"function": getattr(fn, "__qualname__", code.co_name), "file": code.co_filename,
                                "line": code.co_firstlineno, "module": name or type(m).__name__})
        except Exception:
            continue
    return out


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
            for st in list(getattr(o, "state", {}).values()):
                if isinstance(st, dict):
                    for v in st.values():
                        state += c.count(v)
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
    if isinstance(v, _CONTAINERS):
        return True
    try:
        import collections

        return isinstance(v, collections.deque)
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
    budget = [_MAX_ELEMENTS]

    def items(x):
        return x.values() if isinstance(x, dict) else x

    def one(t):
        nonlocal total, count
        if not isinstance(t, torch.Tensor) or not c.on_device(t):
            return
        key, n = c.storage(t)
        if key in c.seen or key in seen:
            return
        seen.add(key)
        total += n
        count += 1

    def walk(x, depth):
        for e in items(x):
            budget[0] -= 1
            if budget[0] <= 0 or (budget[0] & 1023 == 0 and time.monotonic() > deadline):
                raise _Out()
            if isinstance(e, torch.Tensor):
                one(e)
            elif depth and _is_container(e):
                walk(e, depth - 1)
            elif depth and isinstance(getattr(e, "__dict__", None), dict) and not isinstance(e, type):
                # An object of plain attributes (a record of a step's outputs).
                walk(e.__dict__, 0)

    try:
        walk(v, 1)
    except _Out:
        pass
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
            local = dict(f.f_locals)
        except Exception:
            continue
        for name, v in local.items():
            consider(v, name, f"a local of {f.f_code.co_name}",
                     lambda f=f: _codes_of([f.f_code], time.monotonic() + _KEEPERS_MS / 1000.0))
        owner = local.get("self")
        if owner is not None and isinstance(getattr(owner, "__dict__", None), dict):
            cls = type(owner).__name__
            for name, v in list(owner.__dict__.items()):
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
        code = getattr(v, "__code__", None)
        if code is not None and not _library_file(code.co_filename):
            roots.append(code)
    return _codes_of(roots, time.monotonic() + _KEEPERS_MS / 1000.0)


def _method_codes(obj):
    roots = []
    for cls in type(obj).__mro__[:8]:
        for v in list(vars(cls).values()):
            code = getattr(v, "__code__", None)
            if code is not None and not _library_file(code.co_filename):
                roots.append(code)
    return _codes_of(roots, time.monotonic() + _KEEPERS_MS / 1000.0)


def _describe_module(m, path):
    if m is None:
        return None
    short, full = _qualname(m)
    return {"class": short, "qualified_class": full, "path": path}


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
    view = _stack_view(torch, frame)
    c = _Counter(torch, device, deadline)
    models, optimizers, complete = _find_roots(torch, deadline)
    out["complete"] = complete
    # A model the stack shows first, then the ones the hooks saw, then the rest.
    outer = view["outer_module"]
    if outer is not None:
        top = next((m for m in models if m is outer or _module_path(m, outer, deadline) is not None), outer)
        models = [top] + [m for m in models if m is not top]
    param_total = grad_total = state_total = 0
    model_list = []
    signatures = {}
    opt_list = []
    try:
        for m in models:
            if len(model_list) >= _MAX_MODELS:
                out["complete"] = False
                break
            nbytes = count = 0
            dtypes = {}
            shapes = []
            g = 0
            for p in m.parameters():
                n = c.count(p)
                if not c.on_device(p):
                    continue
                shapes.append((tuple(int(x) for x in p.shape), str(p.dtype)))
                if n:
                    nbytes += n
                    count += 1
                    key = str(p.dtype).replace("torch.", "")
                    dtypes[key] = dtypes.get(key, 0) + n
            if not shapes:
                continue
            short, full = _qualname(m)
            entry = {"class": short, "qualified_class": full, "bytes": nbytes, "tensors": count,
                     "dtypes": dtypes, "training": bool(getattr(m, "training", True))}
            sig = hash(tuple(shapes))
            if sig in signatures and nbytes:
                entry["duplicate_of"] = signatures[sig]
            elif nbytes:
                signatures[sig] = len(model_list)
            model_list.append(entry)
            param_total += nbytes
            for p in m.parameters():
                g += c.count(getattr(p, "grad", None))
            entry["grad_bytes"] = g
            grad_total += g
        for o in optimizers:
            groups = getattr(o, "param_groups", [])
            pbytes = 0
            loose = 0
            params = []
            for group in groups:
                for p in group.get("params", []):
                    params.append(p)
            for p in params:
                if not isinstance(p, torch.Tensor) or not c.on_device(p):
                    continue
                key, n = c.storage(p)
                pbytes += n
                if key not in c.seen:
                    # A parameter of no model found: it is a parameter all the same.
                    loose += c.count(p)
                    grad_total += c.count(getattr(p, "grad", None))
            sbytes = 0
            for st in list(getattr(o, "state", {}).values()):
                if isinstance(st, dict):
                    for v in st.values():
                        sbytes += c.count(v)
            short, full = _qualname(o)
            opt_list.append({"class": short, "qualified_class": full, "bytes": sbytes, "param_bytes": pbytes})
            state_total += sbytes
            if loose:
                model_list.append({"class": "(parameters of " + short + " outside any model)", "qualified_class": "",
                                   "bytes": loose, "tensors": 0, "dtypes": {}, "training": True})
                param_total += loose
            if len(opt_list) >= _MAX_MODELS:
                break
    except _Out:
        out["complete"] = False
    out["models"] = model_list
    out["optimizers"] = opt_list
    out["parameters_bytes"] = param_total
    out["gradients_bytes"] = grad_total
    out["optimizer_state_bytes"] = state_total
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
    if shape:
        out["input_shape"] = shape
        out["batch"] = shape[0]
    out["in_loss"] = view["in_loss"]
    if view["framework_frame"]:
        out["framework_frame"] = view["framework_frame"]
    program_frame = view["program_frame"]
    if program_frame is None and view["phase"] == "backward":
        program_frame = _caller_of_backward(torch)
    if program_frame:
        out["program_frame"] = program_frame
    if view["optimizer"] is not None:
        out["step_optimizer"] = _qualname(view["optimizer"])[0]
    hooks = _program_hooks(models[:_MAX_MODELS], deadline)
    if hooks:
        out["forward_hooks"] = hooks
    try:
        keepers = _keepers(torch, c, frame, models[:_MAX_MODELS],
                           min(deadline, time.monotonic() + _KEEPERS_MS / 1000.0))
    except Exception:
        keepers = None
    if keepers:
        out["keepers"] = keepers
    out["found_by"] = "hooks" if (_models or _optimizers) else "gc"
    out["request_bytes"] = int(request_bytes) if request_bytes is not None else None
    out["elapsed_ms"] = round((time.monotonic() - start) * 1000, 1)
    return out
