/* A replayed WebGPU plan's dispatches encoded in one call (ember.webgpu.native.stream_submit):
 * the loop of three wgpu-native calls per dispatch that Python otherwise makes through cffi
 * (~1.8 us a dispatch on the GPU machine's host, the bulk of a decode step's encoding).
 *
 * The functions are wgpu-native's own, their addresses given by the caller (wgpu-py's cffi
 * handles, the same library this process already loaded): nothing here links against wgpu.
 * cmds holds five words per dispatch: the pipeline (0: the one set before stays), the bind group
 * of group 0, and the workgroup counts x, y, z. Errors are wgpu-native's to report: a compute
 * pass defers its validation to the command encoder's finish(), which Python calls after this. */
#include "ember_native.h"

typedef void (*set_pipeline_fn)(void *pass, void *pipeline);
typedef void (*set_bind_group_fn)(void *pass, uint32_t index, void *group, size_t n_offsets, const uint32_t *offsets);
typedef void (*dispatch_fn)(void *pass, uint32_t x, uint32_t y, uint32_t z);

EXPORT void ember_encode_dispatches(void *pass, uintptr_t set_pipeline, uintptr_t set_bind_group,
                                    uintptr_t dispatch, const uint64_t *cmds, i64 n) {
  set_pipeline_fn sp = (set_pipeline_fn)set_pipeline;
  set_bind_group_fn sb = (set_bind_group_fn)set_bind_group;
  dispatch_fn d = (dispatch_fn)dispatch;
  for (i64 i = 0; i < n; i++) {
    const uint64_t *c = cmds + 5 * i;
    if (c[0]) sp(pass, (void *)(uintptr_t)c[0]);
    sb(pass, 0, (void *)(uintptr_t)c[1], 0, NULL);
    d(pass, (uint32_t)c[2], (uint32_t)c[3], (uint32_t)c[4]);
  }
}
