// python/src/array_arguments.hpp — the array arguments of one native call as TensorViews.
//
// Two routes in, both DLPack:
//  * the DLPack C exchange API (`type(x).__dlpack_c_exchange_api__`, DLPack >= 1.2; torch
//    >= 2.10 has it): a C function fills a DLTensor that borrows the object's own shape and
//    strides. No capsule is made, parsed or freed and no Python code runs, which is most of
//    what a small call used to cost (torch.utils.dlpack.to_dlpack + nanobind's import +
//    the capsule's deleter: ~1 us per tensor). The same table gives the framework's current
//    stream (stream=None). Nothing here links against the framework;
//  * anything else (NumPy, capsules, older torch, CuPy, ...) through nanobind's DLPack /
//    buffer-protocol import (tensor_view_from_dlpack.hpp).
// A borrowed view is valid while its Python object is alive: the caller's arguments
// outlive the call. Imports made here live until the reader is destroyed.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "flashattn/tensor.hpp"
#include "python/src/tensor_view_from_dlpack.hpp"

namespace flashattn::python {

namespace nb = nanobind;

// The DLPack C exchange API's table (dlpack.h, DLPackExchangeAPI), laid out as the
// standard fixes it; the DLTensor is nanobind's copy of dlpack.h's struct.
struct DLPackExchangeApiHeader {
  std::uint32_t major;
  std::uint32_t minor;
  const DLPackExchangeApiHeader* prev_api;
};
struct DLPackExchangeApi {
  DLPackExchangeApiHeader header;
  void* managed_tensor_allocator;
  void* managed_tensor_from_py_object_no_sync;
  void* managed_tensor_to_py_object_no_sync;
  int (*dltensor_from_py_object_no_sync)(void* py_object, nb::dlpack::dltensor* out);  // may be null
  int (*current_work_stream)(std::int32_t device_type, std::int32_t device_id, void** out_stream);
};
inline constexpr std::uint32_t kExchangeApiMajor = 1;

// Per Python type: its exchange table, or null (use the DLPack import). Types are kept
// referenced so a cached address is never reused by another type.
class ExchangeApiCache {
 public:
  const DLPackExchangeApi* lookup(PyTypeObject* type) {
    for (std::size_t i = 0; i < count_; ++i)
      if (entries_[i].type == type) return entries_[i].api;
    const DLPackExchangeApi* api = find(type);
    if (count_ < entries_.size()) {
      Py_INCREF(reinterpret_cast<PyObject*>(type));
      entries_[count_++] = {type, api};
    }
    return api;
  }

 private:
  static const DLPackExchangeApi* find(PyTypeObject* type) {
    PyObject* attribute = PyObject_GetAttrString(reinterpret_cast<PyObject*>(type), "__dlpack_c_exchange_api__");
    if (attribute == nullptr) {
      PyErr_Clear();
      return nullptr;
    }
    const nb::object owned = nb::steal(attribute);
    const void* pointer = nullptr;
    if (PyCapsule_CheckExact(attribute)) {
      pointer = PyCapsule_GetPointer(attribute, "dlpack_exchange_api");
    } else if (PyLong_Check(attribute)) {  // the first releases published the address as an int
      pointer = PyLong_AsVoidPtr(attribute);
    }
    if (pointer == nullptr) {
      PyErr_Clear();
      return nullptr;
    }
    // A newer major version may chain to an older table we understand.
    for (auto* header = static_cast<const DLPackExchangeApiHeader*>(pointer); header != nullptr; header = header->prev_api) {
      if (header->major == kExchangeApiMajor) {
        const auto* api = reinterpret_cast<const DLPackExchangeApi*>(header);
        return api->dltensor_from_py_object_no_sync != nullptr && api->current_work_stream != nullptr ? api : nullptr;
      }
    }
    return nullptr;
  }

  struct Entry {
    PyTypeObject* type;
    const DLPackExchangeApi* api;
  };
  std::array<Entry, 8> entries_{};
  std::size_t count_ = 0;
};

inline ExchangeApiCache& exchange_api_cache() {
  static ExchangeApiCache cache;  // the GIL serialises every use
  return cache;
}

// For messages: "ndarray", "list", ... (the class's own name, as Python code would say).
inline std::string type_short_name(nb::handle object) {
  PyObject* name = PyObject_GetAttrString(reinterpret_cast<PyObject*>(Py_TYPE(object.ptr())), "__name__");
  if (name == nullptr) {
    PyErr_Clear();
    return "?";
  }
  const nb::object owned = nb::steal(name);
  return nb::cast<std::string>(owned);
}

// The arrays of one call. The first array read (q, or out_a) decides the route of the
// rest: after a tensor with the exchange API, every array must come from the same
// framework (the same table), as it must live on the same device and follow the same
// stream.
class ArrayArguments {
 public:
  TensorView input(nb::handle array, const char* name) { return read(array, name, true); }
  TensorView output(nb::handle array, const char* name) { return read(array, name, false); }
  TensorView maybe_input(nb::handle array, const char* name) {
    return array.is_none() ? TensorView{} : read(array, name, true);
  }
  TensorView maybe_output(nb::handle array, const char* name) {
    return array.is_none() ? TensorView{} : read(array, name, false);
  }

  // The stream to launch on: the given one, or (None) the framework's current stream on
  // the arrays' device, from the exchange API.
  void* stream(std::optional<std::uintptr_t> given) const {
    if (given) return reinterpret_cast<void*>(*given);
    if (!first_device_ || first_device_->type != DeviceType::cuda) return nullptr;
    if (first_api_ == nullptr)
      throw nb::value_error("flashattn: stream: None needs arrays whose type has the DLPack C exchange API "
                            "(__dlpack_c_exchange_api__); pass the stream explicitly");
    void* current = nullptr;
    if (first_api_->current_work_stream(kDLCUDA, first_device_->index, &current) != 0) nb::raise_python_error();
    return current;
  }

 private:
  TensorView read(nb::handle array, const char* name, bool is_input) {
    PyTypeObject* type = Py_TYPE(array.ptr());
    const DLPackExchangeApi* api = type == first_type_ ? first_api_ : exchange_api_cache().lookup(type);
    if (!first_device_) {
      first_type_ = type;
      first_api_ = api;
      first_name_ = name;
    } else if (first_api_ != nullptr && api != first_api_) {  // another framework (or none) than q's
      throw nb::type_error(("flashattn: " + std::string(name) + ": expected a " + qualified_type_name(first_type_) +
                            " like " + first_name_ + ", got " + (array.is_none() ? std::string("None") : type_short_name(array))).c_str());
    }
    TensorView view;
    if (api != nullptr) {
      nb::dlpack::dltensor borrowed{};
      if (api->dltensor_from_py_object_no_sync(array.ptr(), &borrowed) != 0) nb::raise_python_error();
      view = tensor_view_from_dltensor(borrowed, name);
    } else {
      view = is_input ? import_input(array, name) : import_output(array, name);
    }
    if (!first_device_) first_device_ = view.device;
    return view;
  }

  // "torch.Tensor": module and name of the type that set the route.
  static std::string qualified_type_name(PyTypeObject* type) {
    const nb::handle type_object(reinterpret_cast<PyObject*>(type));
    PyObject* module = PyObject_GetAttrString(type_object.ptr(), "__module__");
    if (module == nullptr) {
      PyErr_Clear();
      return type->tp_name;
    }
    const nb::object owned = nb::steal(module);
    PyObject* name = PyObject_GetAttrString(type_object.ptr(), "__name__");
    if (name == nullptr || !PyUnicode_Check(owned.ptr())) {
      PyErr_Clear();
      Py_XDECREF(name);
      return type->tp_name;
    }
    const nb::object owned_name = nb::steal(name);
    return nb::cast<std::string>(owned) + "." + nb::cast<std::string>(owned_name);
  }

  // Why nanobind could not import an array, in the caller's terms: None where a tensor
  // is required, a NumPy dtype DLPack cannot carry (object, str, datetime, structured,
  // big-endian, ml_dtypes' bfloat16), a read-only array given as an output.
  static std::string import_failure(nb::handle array, const char* name, bool is_output) {
    const std::string prefix = "flashattn: " + std::string(name) + ": ";
    if (array.is_none()) return prefix + "expected an array, got None";
    if (!nb::hasattr(array, "dtype") || !nb::hasattr(array, "shape"))
      return prefix + "expected an array (DLPack or buffer protocol), got " + type_short_name(array);
    try {
      const nb::object dtype = array.attr("dtype");
      const std::string dtype_text = nb::cast<std::string>(nb::str(dtype));
      if (nb::hasattr(dtype, "byteorder") && nb::cast<std::string>(dtype.attr("byteorder")) == ">")
        return prefix + "unsupported dtype: expected float32, float16 or bfloat16 in native (little-endian) byte order, got big-endian " +
               nb::cast<std::string>(nb::str(dtype.attr("str")));
      if (is_output && nb::hasattr(array, "flags") && !nb::cast<bool>(array.attr("flags").attr("writeable")))
        return prefix + "expected a writable array (it is written), got a read-only " + type_short_name(array);
      return prefix + "unsupported dtype: expected float32, float16 or bfloat16 (int32 for indices), got " + dtype_text +
             " (which DLPack and the buffer protocol cannot pass)";
    } catch (const std::exception&) {
      PyErr_Clear();
      return prefix + "expected an array (DLPack or buffer protocol), got " + type_short_name(array);
    }
  }

  TensorView import_input(nb::handle array, const char* name) {
    if (input_count_ == inputs_.size()) throw nb::value_error("flashattn: too many array arguments");
    nb::ndarray<nb::ro>& slot = inputs_[input_count_];
    if (!nb::try_cast(array, slot, /*convert=*/false)) throw nb::type_error(import_failure(array, name, false).c_str());
    ++input_count_;
    return tensor_view_from_dlpack(slot, name);
  }

  TensorView import_output(nb::handle array, const char* name) {
    if (output_count_ == outputs_.size()) throw nb::value_error("flashattn: too many array arguments");
    nb::ndarray<>& slot = outputs_[output_count_];
    if (!nb::try_cast(array, slot, /*convert=*/false)) throw nb::type_error(import_failure(array, name, true).c_str());
    ++output_count_;
    return tensor_view_from_dlpack(slot, name);
  }

  std::optional<Device> first_device_;
  PyTypeObject* first_type_ = nullptr;
  const DLPackExchangeApi* first_api_ = nullptr;
  const char* first_name_ = "";
  std::array<nb::ndarray<nb::ro>, 32> inputs_{};  // block masks bring up to 15 arrays
  std::array<nb::ndarray<>, 6> outputs_{};
  std::size_t input_count_ = 0;
  std::size_t output_count_ = 0;
};

}  // namespace flashattn::python
