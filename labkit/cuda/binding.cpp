// binding.cpp: the PyTorch face of the kernels in *.cu.
//
// Checks each tensor (CUDA, float32, contiguous, shapes that fit), allocates the output,
// runs the launcher on the tensor's GPU and PyTorch's current stream, and turns a failed
// launch into a Python RuntimeError. Only this file includes torch/extension.h (slow to
// compile); the kernels are plain CUDA.
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <limits>

#include "labkit_cuda.cuh"

namespace {

void check_tensor(const torch::Tensor& t, const char* name) {
    TORCH_CHECK(t.is_cuda(), name, " is on ", t.device(),
                ": these CUDA kernels take CUDA tensors; move it with ", name, ".cuda()");
    TORCH_CHECK(t.scalar_type() == torch::kFloat32, name, " has dtype ", t.scalar_type(),
                ": these kernels take float32; convert it with ", name, ".float()");
    TORCH_CHECK(t.is_contiguous(), name, " is not contiguous (a transpose or strided view?): ",
                "pass ", name, ".contiguous()");
}

void check_same_device(const torch::Tensor& a, const torch::Tensor& b) {
    TORCH_CHECK(a.device() == b.device(), "the inputs are on different devices (", a.device(),
                " and ", b.device(), "): move them to one GPU");
}

void check_launch(cudaError_t err, const char* kernel) {
    TORCH_CHECK(err == cudaSuccess, kernel, " failed to launch: ", cudaGetErrorString(err));
}

int as_int(int64_t v, const char* what) {
    TORCH_CHECK(v <= std::numeric_limits<int>::max(), what, " = ", v,
                " is too large for these kernels (at most 2^31 - 1)");
    return static_cast<int>(v);
}

torch::Tensor vector_add(torch::Tensor x, torch::Tensor y) {
    check_tensor(x, "x");
    check_tensor(y, "y");
    check_same_device(x, y);
    TORCH_CHECK(x.sizes() == y.sizes(), "x has shape ", x.sizes(), " but y has shape ", y.sizes(),
                ": vector_add needs equal shapes (broadcast with y.expand_as(x).contiguous())");
    const c10::cuda::CUDAGuard guard(x.device());
    auto out = torch::empty_like(x);
    check_launch(labkit::launch_vector_add(x.data_ptr<float>(), y.data_ptr<float>(),
                                           out.data_ptr<float>(), x.numel(),
                                           c10::cuda::getCurrentCUDAStream().stream()),
                 "vector_add");
    return out;
}

torch::Tensor matmul(torch::Tensor a, torch::Tensor b, bool tiled) {
    check_tensor(a, "a");
    check_tensor(b, "b");
    check_same_device(a, b);
    TORCH_CHECK(a.dim() == 2 && b.dim() == 2, "a and b must be 2-D matrices; got a.dim() = ",
                a.dim(), ", b.dim() = ", b.dim());
    TORCH_CHECK(a.size(1) == b.size(0), "a is ", a.size(0), " x ", a.size(1), " and b is ",
                b.size(0), " x ", b.size(1), ": a's columns must equal b's rows");
    const int m = as_int(a.size(0), "m"), k = as_int(a.size(1), "k"), n = as_int(b.size(1), "n");
    const c10::cuda::CUDAGuard guard(a.device());
    auto c = torch::empty({m, n}, a.options());
    auto stream = c10::cuda::getCurrentCUDAStream().stream();
    const float *pa = a.data_ptr<float>(), *pb = b.data_ptr<float>();
    float* pc = c.data_ptr<float>();
    check_launch(tiled ? labkit::launch_matmul_tiled(pa, pb, pc, m, n, k, stream)
                       : labkit::launch_matmul_naive(pa, pb, pc, m, n, k, stream),
                 tiled ? "matmul_tiled" : "matmul_naive");
    return c;
}

torch::Tensor matmul_naive(torch::Tensor a, torch::Tensor b) { return matmul(a, b, false); }
torch::Tensor matmul_tiled(torch::Tensor a, torch::Tensor b) { return matmul(a, b, true); }

torch::Tensor block_sum(torch::Tensor x) {
    check_tensor(x, "x");
    const c10::cuda::CUDAGuard guard(x.device());
    auto partials = torch::empty({labkit::kSumMaxBlocks}, x.options());
    auto out = torch::empty({}, x.options());  // a 0-d tensor, like torch.sum
    check_launch(labkit::launch_block_sum(x.data_ptr<float>(), x.numel(), partials.data_ptr<float>(),
                                          out.data_ptr<float>(),
                                          c10::cuda::getCurrentCUDAStream().stream()),
                 "block_sum");
    return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "labkit's teaching CUDA kernels (float32, contiguous CUDA tensors)";
    m.def("vector_add", &vector_add, "out = x + y", pybind11::arg("x"), pybind11::arg("y"));
    m.def("matmul_naive", &matmul_naive, "a @ b, one thread per output", pybind11::arg("a"),
          pybind11::arg("b"));
    m.def("matmul_tiled", &matmul_tiled, "a @ b through shared-memory tiles", pybind11::arg("a"),
          pybind11::arg("b"));
    m.def("block_sum", &block_sum, "sum of all elements (two-pass block reduction)",
          pybind11::arg("x"));
}
