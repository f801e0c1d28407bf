"""Argument conversion and the small helpers shared by interface.py and _torch_ops.py.

Both modules import this one and not each other (interface imports _torch_ops lazily,
on the first torch.Tensor). Every conversion names the argument in its error, so a
hostile value gives "flashattn: <argument>: ..." and never a bare OverflowError, an
AttributeError or nanobind's "incompatible function arguments" signature dump. The
common Python types take a fast path: these run on every call.
"""

import math
import operator

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_INT32_MAX = 2**31 - 1


def _type_name(value):
    return "None" if value is None else type(value).__name__


def as_int(value, name, low=_INT64_MIN, high=_INT64_MAX):
    """An integer in [low, high]: Python ints, NumPy and torch integer scalars (0-d
    tensors and arrays too); floats (even integral ones) and strings are refused."""
    if type(value) is not int:
        if isinstance(value, float) or isinstance(value, str) or value is None:
            raise TypeError(f"flashattn: {name}: expected an integer, got {value!r}")
        try:
            value = operator.index(value)
        except TypeError:
            item = getattr(value, "item", None)  # a 0-d integer tensor/array
            if getattr(value, "ndim", None) == 0 and item is not None and isinstance(item(), int):
                value = item()
            else:
                raise TypeError(f"flashattn: {name}: expected an integer, got {_type_name(value)} {value!r}") from None
    if not low <= value <= high:
        raise ValueError(f"flashattn: {name}: out of range: expected an integer in [{low}, {high}], got {value}")
    return value


def as_float(value, name, allow_none=False):
    """A real number as a Python float (the native layer then judges it as float32)."""
    if type(value) is float:
        return value
    if value is None:
        if allow_none:
            return None
        raise TypeError(f"flashattn: {name}: expected a real number, got None")
    if isinstance(value, (str, bytes, complex)) or getattr(value, "ndim", 0) not in (0, None):
        raise TypeError(f"flashattn: {name}: expected a real number, got {_type_name(value)} {value!r}")
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"flashattn: {name}: out of range: {value!r} does not fit a double") from None
    except (TypeError, ValueError):
        raise TypeError(f"flashattn: {name}: expected a real number, got {_type_name(value)} {value!r}") from None


def as_bool(value, name):
    """A flag: bool, NumPy/torch booleans and integers, 0-d arrays; never an array of several."""
    if type(value) is bool:
        return value
    if getattr(value, "ndim", 0) not in (0, None) or isinstance(value, (str, bytes)) or value is None:
        raise TypeError(f"flashattn: {name}: expected a bool, got {_type_name(value)} {value!r}")
    try:
        return bool(value)
    except (TypeError, ValueError):
        raise TypeError(f"flashattn: {name}: expected a bool, got {_type_name(value)}") from None


def window(window_size):
    """(left, right) from any pair of integers, or a 2-element integer tensor/array;
    -1 = unbounded, values >= the sequence length also mean unbounded."""
    if type(window_size) is tuple and window_size == (-1, -1):  # the default, on the hot path
        return -1, -1
    pair = window_size
    if hasattr(pair, "tolist") and getattr(pair, "ndim", 1) == 1:
        pair = pair.tolist()
    if isinstance(pair, (str, bytes)) or not hasattr(pair, "__len__") or len(pair) != 2:
        raise ValueError(
            f"flashattn: window_size: expected a pair (left, right) of ints, -1 = unbounded, got {window_size!r}"
        )
    left, right = pair
    try:
        return as_int(left, "window_size"), as_int(right, "window_size")
    except (TypeError, ValueError) as e:
        raise type(e)(f"{e} (window_size = {window_size!r}: a pair of integers, -1 = unbounded)") from None


def check_not_none(name, value, like="q"):
    if value is None:
        raise TypeError(f"flashattn: {name}: expected a tensor like {like}, got None")


def shape_string(shape):
    return "[" + ", ".join(str(s) for s in shape) + "]"


def check_rank(tensor, name, expected):
    """The C++ rank check, run before the output shapes are derived from `tensor`."""
    ndim = getattr(tensor, "ndim", None)
    if ndim is None:
        raise TypeError(f"flashattn: {name}: expected an array or tensor, got {_type_name(tensor)}")
    if ndim != expected:
        raise ValueError(
            f"flashattn: {name}: wrong rank: expected {expected}, got {ndim} {shape_string(tensor.shape)}"
        )


def check_before_allocating(q, name="q"):
    """What must hold before an output shaped like `q` is allocated: a last dimension
    that is contiguous (np.broadcast_to can fake a head_dim of 2^40 at no cost; out
    would not be free). The C++ layer checks everything else, with the same message."""
    shape = q.shape
    if len(shape) and shape[-1] > 1 and 0 not in shape:  # an empty array's strides mean nothing
        stride = q.stride(-1) if callable(getattr(q, "stride", None)) else q.strides[-1] // q.itemsize
        if stride != 1:
            raise ValueError(f"flashattn: {name}: last dimension must be contiguous: stride expected 1, got {stride}")


def allocation_error(name, shape, itemsize, error):
    count = math.prod(shape)
    return MemoryError(f"flashattn: {name}: cannot allocate {count * itemsize} bytes for shape {shape_string(shape)} "
                       f"({error})")


def lse_shape(q, is_varlen):
    """softmax_lse's shape: (batch, nheads, seqlen_q), varlen (nheads, total_q)."""
    if is_varlen:
        return (q.shape[1], q.shape[0])
    return (q.shape[0], q.shape[2], q.shape[1])


def kvcache_native_arguments(arguments, out, lse):
    """flash_attn_with_kvcache's arguments in the native call's order."""
    (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, uniform_cache_seqlen, cache_batch_idx,
     cache_leftpad, block_table, softmax_scale, causal, window_left, window_right, softcap, rotary_interleaved,
     num_splits) = arguments
    return (q, k_cache, v_cache, k, v, cache_seqlens, uniform_cache_seqlen, cache_batch_idx, cache_leftpad, block_table,
            rotary_cos, rotary_sin, rotary_interleaved, out, lse, num_splits, softmax_scale, causal, window_left,
            window_right, softcap)
