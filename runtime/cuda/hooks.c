/* Installs the CUDA backend into the core: the caching allocator (alloc.h), host<->device and
 * device<->device transfers plus on-device strided copy/cast and fill (tensor.h), and Philox
 * random fills (random.h). Installing touches no CUDA API, so it runs at program start; the
 * runtime itself starts on the first CUDA tensor. */
#include "cuda/device.h"

#ifdef ZR_HAVE_CUDA
#include <stdio.h>

#include "core/random.h"
#include "kernels/cuda/copy.h"
#include "kernels/cuda/random.h"

const zr_alloc_backend *zr_cuda_alloc_backend(void);

/* Contiguous transfer of nbytes where at least one side is a GPU. Host->device returns once the
 * host buffer has been staged (the caller may free it); device->host waits for the data. */
static zr_status transfer(void *dst, zr_device ddev, const void *src, zr_device sdev, size_t nbytes) {
    if (nbytes == 0) return ZR_OK;
    char dn[16], sn[16], op[64];
    snprintf(op, sizeof op, "copy %s -> %s", zr_device_name(sdev, sn), zr_device_name(ddev, dn));
    if (sdev.type == ZR_CPU) {
        cudaStream_t s = zr_cuda_stream(ddev);
        ZR_CHECK(ZR_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, s), op));
        /* from page-locked memory the copy is a DMA still reading src: wait, as from pageable memory
         * (the driver stages that before returning) */
        struct cudaPointerAttributes pa;
        if (cudaPointerGetAttributes(&pa, src) != cudaSuccess) cudaGetLastError();
        else if (pa.type == cudaMemoryTypeHost) return ZR_CUDA_CHECK(cudaStreamSynchronize(s), op);
        return ZR_OK;
    }
    if (ddev.type == ZR_CPU) {
        cudaStream_t s = zr_cuda_stream(sdev);
        ZR_CHECK(ZR_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, s), op));
        return ZR_CUDA_CHECK(cudaStreamSynchronize(s), op);
    }
    if (ddev.index == sdev.index) {
        cudaStream_t s = zr_cuda_stream(sdev);
        return ZR_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, s), op);
    }
    /* Between GPUs (rare outside NCCL): order against both devices' compute streams. */
    cudaStream_t ds = zr_cuda_stream(ddev);
    ZR_CHECK(ZR_CUDA_CHECK(cudaStreamSynchronize(ds), op));
    cudaStream_t ss = zr_cuda_stream(sdev);
    ZR_CHECK(ZR_CUDA_CHECK(cudaMemcpyPeerAsync(dst, ddev.index, src, sdev.index, nbytes, ss), op));
    return ZR_CUDA_CHECK(cudaStreamSynchronize(ss), op);
}

static zr_status device_copy(zr_tensor *dst, const zr_tensor *src) {
    zr_device dev = dst->storage->device;
    if (!zr_device_eq(dev, src->storage->device)) {
        char a[16], b[16];
        return zr_error("copy: destination is on %s but source is on %s", zr_device_name(dev, a),
                        zr_device_name(src->storage->device, b));
    }
    cudaStream_t s = zr_cuda_stream(dev);
    if (copy_strided_cuda(zr_tensor_data(dst), dst->dtype, dst->stride, zr_tensor_data(src), src->dtype,
                          src->stride, dst->ndim, dst->shape, s)) {
        char d[16];
        zr_error_prefix("copy on %s: ", zr_device_name(dev, d));
        return ZR_ERR;
    }
    return ZR_OK;
}

static zr_status device_fill(zr_tensor *t, double v) {
    zr_device dev = t->storage->device;
    if (fill_strided_cuda(zr_tensor_data(t), t->dtype, t->stride, t->ndim, t->shape, v, zr_cuda_stream(dev))) {
        char d[16];
        zr_error_prefix("fill on %s: ", zr_device_name(dev, d));
        return ZR_ERR;
    }
    return ZR_OK;
}

static zr_status device_random(zr_tensor *t, int kind, double a, double b, uint64_t seed, uint64_t offset) {
    zr_device dev = t->storage->device;
    if (!zr_tensor_is_contiguous(t)) return zr_error("random fill: the CUDA fill needs a contiguous tensor");
    if (random_fill_cuda(zr_tensor_data(t), t->dtype, zr_tensor_numel(t), kind, a, b, seed, offset,
                         zr_cuda_stream(dev))) {
        char d[16];
        zr_error_prefix("random fill on %s: ", zr_device_name(dev, d));
        return ZR_ERR;
    }
    return ZR_OK;
}

void zr_cuda_install(void) {
    zr_alloc_set_backend(ZR_CUDA, zr_cuda_alloc_backend());
    zr_tensor_set_device_copy(transfer);
    zr_tensor_set_device_ops(device_copy, device_fill);
    zr_random_set_device_fill(device_random);
}

/* Runs before main in any program that links this file (zrun does, through zr_bind_cuda). */
__attribute__((constructor)) static void install_at_start(void) { zr_cuda_install(); }

#endif
