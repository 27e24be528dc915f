// Python bindings: the engine (set up once per group from Python) and the
// c10d backend class handed to torch.distributed.
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "backend/process_group.hpp"
#include "common/error.h"
#include "kernels/reduce.h"

#ifdef TILECOMM_WITH_CUDA
#include "backend/cuda_glue.hpp"
#endif

namespace py = pybind11;
using namespace tilecomm;

namespace {

// (kind, peer, lo, hi, dep) per op; one list of ops per round.
using PyRound = std::vector<std::tuple<int, int, uint32_t, uint32_t, int>>;

exec::Schedule toSchedule(uint32_t nchunks, const std::vector<PyRound>& rounds) {
  exec::Schedule s;
  s.nchunks = nchunks;
  for (const PyRound& r : rounds) {
    for (const auto& [kind, peer, lo, hi, dep] : r) {
      if (kind < 0 || kind > 2 || lo > hi || hi > nchunks || dep >= static_cast<int>(r.size()))
        throw py::value_error("malformed schedule op");
      s.ops.push_back(exec::SchedOp{static_cast<exec::StepKind>(kind), peer, lo, hi, dep});
    }
    s.round_end.push_back(static_cast<uint32_t>(s.ops.size()));
  }
  return s;
}

template <typename F>
auto translate(F&& f) {
  try {
    return f();
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kInvalid) throw py::value_error(e.what());
    throw std::runtime_error(e.what());
  }
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "tilecomm engine and torch.distributed backend";

  py::class_<exec::Engine, std::shared_ptr<exec::Engine>>(m, "Engine")
      .def(py::init([](int rank, int world, uint32_t slots, uint32_t slot_bytes, int spins, int yields,
                       int64_t sleep_us, int64_t timeout_ms) {
             exec::EngineConfig cfg;
             cfg.shm.slots = slots;
             cfg.shm.slot_bytes = slot_bytes;
             cfg.wait.spins = spins;
             cfg.wait.yields = yields;
             cfg.wait.sleep_us = sleep_us;
             cfg.timeout_ms = timeout_ms;
             return translate([&] { return std::make_shared<exec::Engine>(rank, world, cfg); });
           }),
           py::arg("rank"), py::arg("world"), py::arg("slots"), py::arg("slot_bytes"), py::arg("spins"),
           py::arg("yields"), py::arg("sleep_us"), py::arg("timeout_ms"))
      .def("segment_name", [](exec::Engine& e) { return e.shm().segmentName(); })
      .def("connect",
           [](exec::Engine& e, const std::vector<std::string>& names, const std::vector<int64_t>& pids) {
             translate([&] { e.connect(names, pids); });
           })
      .def("unlink_own", &exec::Engine::unlinkOwn)
      .def("add_algorithm",
           [](exec::Engine& e, int id, const std::string& name, int coll, bool rooted, bool direct,
              const std::vector<std::pair<uint32_t, std::vector<PyRound>>>& schedules) {
             exec::Algorithm a;
             a.id = static_cast<uint16_t>(id);
             a.name = name;
             a.coll = static_cast<Coll>(coll);
             a.rooted = rooted;
             a.direct = direct;
             for (const auto& [nchunks, rounds] : schedules) a.schedules.push_back(toSchedule(nchunks, rounds));
             translate([&] { e.addAlgorithm(std::move(a)); });
           })
      .def("set_table",
           [](exec::Engine& e, int coll, std::vector<std::pair<uint64_t, uint16_t>> table) {
             translate([&] { e.setTable(static_cast<Coll>(coll), std::move(table)); });
           })
      .def("pick", [](exec::Engine& e, int coll, uint64_t nbytes) { return e.pick(static_cast<Coll>(coll), nbytes); })
      .def("start", &exec::Engine::start)
      .def("failure", &exec::Engine::failure);

  auto pg = py::class_<backend::ProcessGroupTilecomm, c10d::Backend,
                        c10::intrusive_ptr<backend::ProcessGroupTilecomm>>(m, "ProcessGroupTilecomm")
                .def(py::init<std::shared_ptr<exec::Engine>, int64_t>(), py::arg("engine"), py::arg("timeout_ms"))
                .def("cuda_status", &backend::ProcessGroupTilecomm::cudaStatus);
#ifdef TILECOMM_WITH_CUDA
  m.attr("HAS_CUDA") = true;
  // CUDA tensors: the group's Store and key prefix (the cuda_ipc handles are exchanged
  // through it on first use) and its settings.
  pg.def(
      "set_cuda",
      [](backend::ProcessGroupTilecomm& self, const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix,
         const std::string& allreduce, uint64_t ipc_bytes, uint64_t two_shot_bytes, int64_t timeout_ms) {
        backend::CudaSettings s;
        s.allreduce = allreduce;
        s.ipc_bytes = ipc_bytes;
        s.two_shot_bytes = two_shot_bytes;
        s.timeout_ms = timeout_ms;
        self.setCuda(std::make_shared<backend::CudaGroup>(self.getRank(), self.getSize(), store, prefix, s));
      },
      py::arg("store"), py::arg("prefix"), py::arg("allreduce"), py::arg("ipc_bytes"), py::arg("two_shot_bytes"),
      py::arg("timeout_ms"));
#else
  m.attr("HAS_CUDA") = false;
#endif

  // dst = op(dst, src), element-wise; exposed so tests can check the kernels directly.
  m.def("reduce_into", [](at::Tensor dst, const at::Tensor& src, const std::string& op) {
    static const char* kOps[] = {"sum", "product", "min", "max", "band", "bor", "bxor"};
    int idx = -1;
    for (int i = 0; i < 7; ++i)
      if (op == kOps[i]) idx = i;
    TORCH_CHECK_VALUE(idx >= 0, "unknown op ", op);
    TORCH_CHECK_VALUE(dst.is_contiguous() && src.is_contiguous() && dst.numel() == src.numel() &&
                          dst.scalar_type() == src.scalar_type(),
                      "reduce_into needs two contiguous tensors of one dtype and size");
    auto dt = backend::toDType(dst.scalar_type());
    TORCH_CHECK_TYPE(dt.has_value(), "unsupported dtype ", dst.scalar_type());
    std::string why = kernels::checkReducible(*dt, static_cast<RedOp>(idx));
    TORCH_CHECK_TYPE(why.empty(), why);
    kernels::reduceInto(dst.data_ptr(), src.data_ptr(), dst.numel(), *dt, static_cast<RedOp>(idx));
  });
}
