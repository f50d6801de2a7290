// Shared by the matmul kernels. info layout (u32 words):
//   0 M, 1 N, 2 K, 3 batch count
//   4 A offset, 5 A row stride, 6 A k stride       (elements; A is M x K)
//   8 B offset, 9 B k stride, 10 B column stride   (B is K x N)
//   12.. batch: output batch shape [RANK], A batch strides [RANK], B batch strides [RANK]
// C is written contiguous (M x N per batch). Strides make transposed operands (x @ w.T) free.
fn u(k: u32) -> u32 { return info[k / 4u][k % 4u]; }

// Element offsets of A and B for batch z (broadcast batch axes have stride 0).
fn batch_offsets(z: u32) -> vec2<u32> {
  var a = u(4u);
  var b = u(8u);
  var rem = z;
  for (var d = {{RANK}}; d > 0; d = d - 1) {
    let n = u(11u + u32(d));
    let idx = rem % n;
    rem = rem / n;
    a = a + idx * u(11u + {{RANK}}u + u32(d));
    b = b + idx * u(11u + 2u * {{RANK}}u + u32(d));
  }
  return vec2<u32>(a, b);
}
