// The core's error classes (errors.h) as fastload.errors' typed exceptions, in one translator.
#include <exception>
#include <string>

#include "bindings/bindings.h"
#include "errors.h"

namespace fastload::bindings {
namespace {

void raise_typed(const char* class_name, py::tuple args) {
  py::object cls = py::module_::import("fastload.errors").attr(class_name);
  py::object err = cls(*args);
  PyErr_SetObject(cls.ptr(), err.ptr());
}

}  // namespace

void register_errors(py::module_&) {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const CorruptRecordError& e) {
      raise_typed("CorruptRecordError", py::make_tuple(e.path(), e.record(), e.reason()));
    } catch (const ShardNotFoundError& e) {
      raise_typed("ShardNotFoundError", py::make_tuple(e.path()));
    } catch (const CorruptShardError& e) {
      raise_typed("CorruptShardError", py::make_tuple(e.path(), std::string(e.what())));
    } catch (const FastloadError& e) {
      raise_typed("FastloadError", py::make_tuple(std::string(e.what())));
    }
  });
}

}  // namespace fastload::bindings
