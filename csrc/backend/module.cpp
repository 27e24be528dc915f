// Python bindings: the engine (set up once per group from Python) and the
// c10d backend class handed to torch.distributed; and the collectives as torch
// operators (Note [Operators]).
#include <pybind11/stl.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>

#include <array>
#include <cstring>

#include "backend/process_group.hpp"
#include "common/error.h"
#include "common/host_stages.h"
#include "common/pci.h"
#include "kernels/reduce.h"
#include "exec/device_schedule.h"
#include "exec/fuzz.h"
#include "transport/tcp.h"

#ifdef TILECOMM_WITH_CUDA
#include <c10/cuda/CUDAStream.h>

#include "backend/cuda_glue.hpp"
#include "cuda/nvshmem.h"
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

// Traffic of one group per link class (tilecomm.stats()).
py::dict statsDict(exec::Engine& e) {
  py::dict out;
  for (auto [name, link] : {std::pair{"shm", transport::Link::kShm}, {"tcp", transport::Link::kTcp}}) {
    transport::Transport::Stats s = e.transport().stats(link);
    py::dict d;
    d["bytes_sent"] = s.bytes_sent;
    d["messages_sent"] = s.messages_sent;
    d["bytes_received"] = s.bytes_received;
    d["messages_received"] = s.messages_received;
    out[name] = d;
  }
  return out;
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

// Note [Operators]: torch.ops.tilecomm.all_reduce_ and all_gather_into_tensor_out run one
// collective of a group, named as torch's functional collectives name it (its group_name),
// exactly as a synchronous dist.all_reduce / dist.all_gather_into_tensor of that group would:
// the same backend call with asyncOp=false, then the Work's wait(). What they leave out is
// torch.distributed's Python wrapper and a Work handed to Python, which are most of what a small
// collective costs the host when its kernel takes a few microseconds (docs/benchmarks.md). They
// are the way to call a collective from Python with the least host time, as SymmetricMemory's
// operators are. The group's backend for the tensors' device must be tilecomm. What dist's Python
// does before the call they do too: complex tensors go as real views (SUM and AVG only). They
// return nothing (they write their tensor argument), which lets torch.compile functionalize them;
// on meta tensors they do nothing. A tensor that requires grad (with grad mode on) is refused:
// no gradient flows through them, and dist.all_reduce only warns, then passes the gradient
// through unchanged, which is wrong.

c10::intrusive_ptr<backend::ProcessGroupTilecomm> backendFor(const std::string& group, const at::Tensor& t,
                                                             const char* op) {
  c10::intrusive_ptr<c10d::ProcessGroup> pg = c10d::resolve_process_group(group);  // throws naming the group
  c10::intrusive_ptr<c10d::Backend> b;
  if (pg->hasBackends()) {
    try {
      b = pg->getBackend(t.device().type());
    } catch (const c10::Error&) {  // no backend for this device type: said below
    }
  }
  auto tc = c10::dynamic_intrusive_pointer_cast<backend::ProcessGroupTilecomm>(b);
  TORCH_CHECK_VALUE(tc, "tilecomm.", op, ": group '", group, "' has no tilecomm backend for ", t.device().type(),
                    " tensors", b ? " (its backend is " + b->getBackendName() + ")" : std::string());
  return tc;
}

c10d::ReduceOp reduceOpNamed(c10::string_view name) {
  static const std::pair<const char*, c10d::ReduceOp::RedOpType> kOps[] = {
      {"sum", c10d::ReduceOp::SUM}, {"avg", c10d::ReduceOp::AVG},   {"product", c10d::ReduceOp::PRODUCT},
      {"min", c10d::ReduceOp::MIN}, {"max", c10d::ReduceOp::MAX},   {"band", c10d::ReduceOp::BAND},
      {"bor", c10d::ReduceOp::BOR}, {"bxor", c10d::ReduceOp::BXOR}};
  for (const auto& [n, op] : kOps)
    if (name == n) return c10d::ReduceOp(op);
  TORCH_CHECK_VALUE(false, "tilecomm.all_reduce_: unknown reduce_op '", std::string(name),
                    "'; one of sum, avg, product, min, max, band, bor, bxor (PREMUL_SUM needs dist.all_reduce)");
}

void allReduceOp(at::Tensor self, c10::string_view reduce_op, c10::string_view group) {
  c10d::AllreduceOptions opts;
  opts.reduceOp = reduceOpNamed(reduce_op);
  opts.asyncOp = false;
  if (self.is_complex()) {  // as dist.all_reduce: the real view, for the ops that allow it
    TORCH_CHECK_VALUE(opts.reduceOp == c10d::ReduceOp::SUM || opts.reduceOp == c10d::ReduceOp::AVG,
                      "tilecomm.all_reduce_: ", std::string(reduce_op), " is not supported on complex tensors");
    self = at::view_as_real(self);
  }
  std::vector<at::Tensor> ts{self};
  backendFor(std::string(group), self, "all_reduce_")->allreduce(ts, opts)->wait();
}

void allGatherOp(const at::Tensor& input, c10::string_view group, at::Tensor out) {
  c10d::AllgatherOptions opts;
  opts.asyncOp = false;
  at::Tensor in = input.is_complex() ? at::view_as_real(input) : input;  // as dist.all_gather_into_tensor
  if (out.is_complex()) out = at::view_as_real(out);
  backendFor(std::string(group), out, "all_gather_into_tensor_out")->_allgather_base(out, in, opts)->wait();
}

void noGrad(std::initializer_list<const at::Tensor*> ts, const char* op) {
  for (const at::Tensor* t : ts)
    TORCH_CHECK_VALUE(!(t->requires_grad() && at::GradMode::is_enabled()), "tilecomm.", op,
                      ": a tensor requires grad, and no gradient flows through this collective; call it under "
                      "torch.no_grad() or on a detached tensor");
}

}  // namespace

TORCH_LIBRARY(tilecomm, m) {
  m.def("all_reduce_(Tensor(a!) self, str reduce_op, str group_name) -> ()");
  m.def("all_gather_into_tensor_out(Tensor input, str group_name, *, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(tilecomm, CPU, m) {
  m.impl("all_reduce_", allReduceOp);
  m.impl("all_gather_into_tensor_out", allGatherOp);
}

TORCH_LIBRARY_IMPL(tilecomm, CUDA, m) {
  m.impl("all_reduce_", allReduceOp);
  m.impl("all_gather_into_tensor_out", allGatherOp);
}

TORCH_LIBRARY_IMPL(tilecomm, Meta, m) {
  m.impl("all_reduce_", [](at::Tensor, c10::string_view, c10::string_view) {});
  // Chosen when either tensor is on meta: a real one beside it is an error, not a call that does nothing.
  m.impl("all_gather_into_tensor_out", [](const at::Tensor& in, c10::string_view, at::Tensor out) {
    TORCH_CHECK_VALUE(in.is_meta() && out.is_meta(), "tilecomm.all_gather_into_tensor_out: tensors on ", in.device(),
                      " and ", out.device(), " in one call");
  });
}

TORCH_LIBRARY_IMPL(tilecomm, Autograd, m) {
  // The checks, then the kernel below autograd (CPU, CUDA or Meta).
  m.impl("all_reduce_", [](at::Tensor self, c10::string_view reduce_op, c10::string_view group) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("tilecomm::all_reduce_", "")
                               .typed<void(at::Tensor, c10::string_view, c10::string_view)>();
    noGrad({&self}, "all_reduce_");
    at::AutoDispatchBelowADInplaceOrView below;
    op.call(self, reduce_op, group);
  });
  m.impl("all_gather_into_tensor_out", [](const at::Tensor& in, c10::string_view group, at::Tensor out) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("tilecomm::all_gather_into_tensor_out", "")
                               .typed<void(const at::Tensor&, c10::string_view, at::Tensor)>();
    noGrad({&in, &out}, "all_gather_into_tensor_out");
    at::AutoDispatchBelowADInplaceOrView below;
    op.call(in, group, out);
  });
}

PYBIND11_MODULE(_C, m) {
  m.doc() = "tilecomm engine and torch.distributed backend";

  py::class_<exec::Engine, std::shared_ptr<exec::Engine>>(m, "Engine")
      .def(py::init([](int rank, int world, uint32_t slots, uint32_t slot_bytes, uint32_t tcp_slots,
                       uint32_t tcp_frame_bytes, int64_t spin_ns, int yields, int64_t sleep_us, int64_t timeout_ms) {
             exec::EngineConfig cfg;
             cfg.shm.slots = slots;
             cfg.shm.slot_bytes = slot_bytes;
             cfg.tcp.slots = tcp_slots;
             cfg.tcp.frame_bytes = tcp_frame_bytes;
             cfg.wait.spin_ns = spin_ns;
             cfg.wait.yields = yields;
             cfg.wait.sleep_us = sleep_us;
             cfg.timeout_ms = timeout_ms;
             return translate([&] { return std::make_shared<exec::Engine>(rank, world, cfg); });
           }),
           py::arg("rank"), py::arg("world"), py::arg("slots"), py::arg("slot_bytes"), py::arg("tcp_slots"),
           py::arg("tcp_frame_bytes"), py::arg("spin_ns"), py::arg("yields"), py::arg("sleep_us"), py::arg("timeout_ms"))
      .def("segment_name", [](exec::Engine& e) { return e.transport().shm().segmentName(); })
      .def("listen", [](exec::Engine& e, const std::string& address) {
        return translate([&] { return e.transport().listen(address); });
      })
      // links[r]: 0 self, 1 shared memory, 2 TCP (transport::Link).
      .def("connect",
           [](exec::Engine& e, const std::vector<int>& links, const std::vector<std::string>& names,
              const std::vector<int64_t>& pids, const std::vector<std::string>& addrs, const std::vector<int>& ports,
              const py::bytes& token, int64_t timeout_ms) {
             std::vector<transport::Link> l;
             for (int v : links) {
               if (v < 0 || v > 2) throw py::value_error("unknown link kind");
               l.push_back(static_cast<transport::Link>(v));
             }
             std::string tok = token;
             py::gil_scoped_release nogil;
             translate([&] { e.transport().connect(l, names, pids, addrs, ports, tok, timeout_ms); });
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
      .def("set_notes",
           [](exec::Engine& e, int coll, std::vector<std::pair<uint64_t, std::string>> notes) {
             e.setNotes(static_cast<Coll>(coll), std::move(notes));
           })
      .def("pick", [](exec::Engine& e, int coll, uint64_t nbytes) { return e.pick(static_cast<Coll>(coll), nbytes); })
      .def("start", &exec::Engine::start)
      .def("failure", &exec::Engine::failure);

  auto pg = py::class_<backend::ProcessGroupTilecomm, c10d::Backend,
                        c10::intrusive_ptr<backend::ProcessGroupTilecomm>>(m, "ProcessGroupTilecomm")
                .def(py::init<std::shared_ptr<exec::Engine>, int64_t, c10::intrusive_ptr<c10d::Store>>(), py::arg("engine"),
                     py::arg("timeout_ms"), py::arg("store"))
                // Note [Splitting]: the Store the group was set up through; its children set up there.
                .def_property_readonly("setup_store", &backend::ProcessGroupTilecomm::setupStore)
                .def("cuda_status", &backend::ProcessGroupTilecomm::cudaStatus)
                .def("stats", [](backend::ProcessGroupTilecomm& self) { return statsDict(self.engine()); })
                // new_group calls it on the ranks left out of a group when the default group is bound
                // to a device and can split (as NCCL's must join ncclCommSplit); Note [Splitting]: a
                // tilecomm child needs nothing from them.
                .def("perform_nocolor_split", [](backend::ProcessGroupTilecomm&, const py::object&) {})
                // dist.split_group deep-copies a group's options for the child, which c10d's own
                // Options cannot be: tilecomm._backend.Options can.
                .def_property_readonly("options", [](backend::ProcessGroupTilecomm& self) {
                  auto opts = self.getBackendOptions();
                  return py::module_::import("tilecomm._backend")
                      .attr("Options")(static_cast<int64_t>(opts->timeout.count()), opts->group_name);
                });
  // Note [Splitting]: a child group is set up by the same Python code as any other group.
  backend::ProcessGroupTilecomm::setSplitHook([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                 int64_t timeout_ms, const std::string& name) {
    py::gil_scoped_acquire gil;
    py::object made = py::module_::import("tilecomm._backend").attr("split")(store, rank, size, timeout_ms, name);
    return c10::intrusive_ptr<c10d::Backend>(made.cast<c10::intrusive_ptr<backend::ProcessGroupTilecomm>>());
  });
#ifdef TILECOMM_WITH_CUDA
  m.attr("HAS_CUDA") = true;
  // CUDA tensors: the group's Store and key prefix (devices and peer-transport handles are
  // exchanged through it on first use) and its settings.
  pg.def(
      "set_cuda",
      [](backend::ProcessGroupTilecomm& self, const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix,
         const std::string& allreduce, uint64_t ipc_bytes, std::array<uint64_t, cuda::kMemories> two_shot_bytes,
         int64_t timeout_ms, const std::string& proto, std::array<uint64_t, cuda::kMemories> ll_bytes,
         uint64_t allgather_ll_bytes, const std::string& transport, const std::string& fence,
         const std::vector<std::tuple<std::string, std::string, std::string>>& gpu_links, const py::dict& nvshmem,
         std::array<uint64_t, 4> register_bytes, uint64_t allgather_register_ll_bytes, const std::string& p2p,
         const std::array<std::vector<std::vector<std::pair<uint64_t, uint16_t>>>, 2>& executor_tables) {
        backend::CudaSettings s;
        for (int m = 0; m < 2; ++m) s.executor_tables[m] = executor_tables[m];
        s.p2p = p2p;
        s.allreduce = allreduce;
        s.ipc_bytes = ipc_bytes;
        s.register_bytes = register_bytes[0];
        s.allgather_register_bytes = register_bytes[1];
        s.alltoall_register_bytes = register_bytes[2];
        s.captured_register_bytes = register_bytes[3];
        s.allgather_register_ll_bytes = allgather_register_ll_bytes;
        s.timeout_ms = timeout_ms;
        s.proto = proto;
        for (int m = 0; m < cuda::kMemories; ++m) {
          s.two_shot_bytes[m] = two_shot_bytes[m];
          s.ll_bytes[m] = ll_bytes[m];
        }
        s.allgather_ll_bytes = allgather_ll_bytes;
        s.transport = transport;
        s.fence = fence;
        // NVSHMEM (cuda/blocks.h): every key is set by _backend.create.
        s.nvshmem_lib = nvshmem["lib"].cast<std::string>();
        s.nvshmem_why = nvshmem["why"].cast<std::string>();
        s.nvshmem_bytes = nvshmem["bytes"].cast<uint64_t>();
        s.nvshmem_data = nvshmem["data"].cast<std::string>();
        s.allgather = nvshmem["all_gather"].cast<std::string>();
        s.reducescatter = nvshmem["reduce_scatter"].cast<std::string>();
        s.allgather_pull_bytes = nvshmem["all_gather_pull_bytes"].cast<uint64_t>();
        s.reducescatter_pull_bytes = nvshmem["reduce_scatter_pull_bytes"].cast<uint64_t>();
        for (const auto& [a, b, kind] : gpu_links) {
          s.gpu_links[canonicalBusId(a) + " " + canonicalBusId(b)] = kind;
          s.gpu_links[canonicalBusId(b) + " " + canonicalBusId(a)] = kind;
        }
        self.setCuda(std::make_shared<backend::CudaGroup>(self.getRank(), self.getSize(), store, prefix, s,
                                                          self.peerWatch()));
      },
      py::arg("store"), py::arg("prefix"), py::arg("allreduce"), py::arg("ipc_bytes"), py::arg("two_shot_bytes"),
      py::arg("timeout_ms"), py::arg("proto"), py::arg("ll_bytes"),
      py::arg("allgather_ll_bytes") = cuda::kLLMaxBytes, py::arg("transport") = "auto",
      py::arg("fence") = "auto",
      py::arg("gpu_links") = std::vector<std::tuple<std::string, std::string, std::string>>{}, py::arg("nvshmem"),
      py::arg("register_bytes") = std::array<uint64_t, 4>{backend::CudaSettings{}.register_bytes,
                                                            backend::CudaSettings{}.allgather_register_bytes,
                                                            backend::CudaSettings{}.alltoall_register_bytes,
                                                            backend::CudaSettings{}.captured_register_bytes},
      py::arg("allgather_register_ll_bytes") = cuda::kLLMaxBytes, py::arg("p2p") = "direct",
      py::arg("executor_tables") = std::array<std::vector<std::vector<std::pair<uint64_t, uint16_t>>>, 2>{});
  // NOTE: without the GIL: it waits for its turn behind the group's operations, whose Future
  // callbacks may need it.
  pg.def("symmetric_empty", &backend::ProcessGroupTilecomm::symmetricEmpty, py::arg("sizes"), py::arg("dtype"),
         py::arg("device"), py::call_guard<py::gil_scoped_release>());
  // NVSHMEM's own fcollect over every PE (benchmarks): out and in on the symmetric heap, on the
  // current stream; NVSHMEM must have been set up by a group.
  m.def("nvshmem_fcollect", [](at::Tensor& out, const at::Tensor& in) {
    TORCH_CHECK_VALUE(cuda::nvshmem::myPe() >= 0, "tilecomm: NVSHMEM is not initialised");
    TORCH_CHECK_VALUE(cuda::nvshmem::onHeap(out.data_ptr(), out.nbytes()) &&
                          cuda::nvshmem::onHeap(in.data_ptr(), in.nbytes()) &&
                          out.nbytes() == in.nbytes() * cuda::nvshmem::nPes(),
                      "tilecomm: nvshmem_fcollect needs symmetric tensors, out = PEs x in");
    int rc = cuda::nvshmem::fcollect(out.data_ptr(), in.data_ptr(), in.nbytes(),
                                     c10::cuda::getCurrentCUDAStream(in.device().index()).stream());
    TORCH_CHECK(rc != cuda::nvshmem::kMissing, "tilecomm: this NVSHMEM library has no nvshmemx_fcollectmem_on_stream");
    TORCH_CHECK(rc == 0, "tilecomm: nvshmemx_fcollectmem_on_stream returned ", rc);
  });
  // NVSHMEM's own float32 sum reduction over every PE (benchmarks), as nvshmem_fcollect.
  m.def("nvshmem_sum_reduce", [](at::Tensor& out, const at::Tensor& in) {
    TORCH_CHECK_VALUE(cuda::nvshmem::myPe() >= 0, "tilecomm: NVSHMEM is not initialised");
    TORCH_CHECK_VALUE(out.scalar_type() == at::kFloat && in.scalar_type() == at::kFloat && out.numel() == in.numel() &&
                          out.is_contiguous() && in.is_contiguous() &&
                          cuda::nvshmem::onHeap(out.data_ptr(), out.nbytes()) &&
                          cuda::nvshmem::onHeap(in.data_ptr(), in.nbytes()),
                      "tilecomm: nvshmem_sum_reduce needs float32 symmetric tensors of one size");
    int rc = cuda::nvshmem::sumReduce(out.data_ptr<float>(), in.data_ptr<float>(), in.numel(),
                                      c10::cuda::getCurrentCUDAStream(in.device().index()).stream());
    TORCH_CHECK(rc != cuda::nvshmem::kMissing,
                "tilecomm: this NVSHMEM library has no nvshmemx_float_sum_reduce_on_stream");
    TORCH_CHECK(rc == 0, "tilecomm: nvshmemx_float_sum_reduce_on_stream returned ", rc);
  });
  m.attr("HAS_NVSHMEM") = cuda::nvshmem::built();
  pg.def("cuda_last_kernel", &backend::ProcessGroupTilecomm::cudaLastKernel);
  // What the GPUs found at the first direct call: the transport, every rank's GPU, the links.
  pg.def("cuda_topology", [](backend::ProcessGroupTilecomm& self) {
    backend::GpuTopology t = self.cudaTopology();
    py::dict d;
    d["transport"] = t.transport;
    d["devices"] = t.devices;
    d["links"] = t.links;
    return d;
  });
#else
  m.attr("HAS_CUDA") = false;
  m.attr("HAS_NVSHMEM") = false;
#endif

  // Why a TCP frame header (raw bytes) is rejected, "" when it is accepted
  // (Note [TCP frames]); exposed for the frame fuzzer.
  m.def("check_frame", [](const py::bytes& raw, int lane, uint64_t expected_seq, uint32_t slot_bytes) {
    std::string b = raw;
    if (b.size() != sizeof(transport::FrameHeader))
      throw py::value_error("a frame header is " + std::to_string(sizeof(transport::FrameHeader)) + " bytes");
    transport::FrameHeader h;
    std::memcpy(&h, b.data(), sizeof(h));
    return transport::checkFrame(h, lane, expected_seq, slot_bytes);
  });
  // Note [Host stages]: tilecomm.host_stages turns the record on and takes its samples.
  m.def("host_stages_start", &host_stages::start);
  m.def("host_stages_stop", &host_stages::stop);
  // The one form of a PCI bus id in which NVML's GPU pairs meet CUDA's devices (common/pci.h).
  m.def("canonical_bus_id", &canonicalBusId);
  m.attr("FRAME_HEADER_BYTES") = sizeof(transport::FrameHeader);
  m.attr("SLOT_HEADER_BYTES") = sizeof(transport::SlotHeader);
  // Fuzzer entry points (tests/fuzz): raw bytes to the receiving code; the reason they were refused.
  m.def("fuzz_tcp_receive", [](const py::bytes& raw, uint32_t slot_bytes) {
    std::string b = raw;
    py::gil_scoped_release nogil;
    return transport::TcpTransport::fuzzReceive(b, slot_bytes);
  });
  m.def("fuzz_slot_receive", [](const py::bytes& raw) {
    std::string b = raw;
    py::gil_scoped_release nogil;
    return exec::fuzzSlotReceive(b);
  });
  m.def("interface_address", [](const std::string& ifname) {
    return translate([&] { return transport::interfaceAddress(ifname); });
  });

  // One rank's program for the GPU's schedule executor (exec/device_schedule.h), for tests: its
  // lanes, rounds and steps, or a ValueError saying why the executor cannot walk the schedule.
  m.def("device_program", [](const std::string& name, bool rooted,
                             const std::vector<std::pair<uint32_t, std::vector<PyRound>>>& schedules, int rank,
                             int world, int root) {
    exec::Algorithm a;
    a.name = name;
    a.rooted = rooted;
    for (const auto& [nchunks, rounds] : schedules) a.schedules.push_back(toSchedule(nchunks, rounds));
    std::string why;
    std::optional<exec::DeviceProgram> p = exec::deviceProgram(a, rank, world, root, &why);
    if (!p) throw py::value_error(why);
    py::dict d;
    d["lanes"] = p->lanes;
    d["rounds"] = p->round_end.size();
    d["steps"] = p->steps.size();
    return d;
  });

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
