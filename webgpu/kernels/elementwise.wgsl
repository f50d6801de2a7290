// Scalar helpers the generated elementwise kernels call (prepended to every fused kernel).
// Values live in their storage type: f32 for float32/float16, i32 for int32/int64, u32 for
// uint8/bool (0/1).

// float16 is stored as f32 on the GPU (Chromium has no shader-f16); every float16 result is
// rounded to half precision here. pack2x16float is undefined outside the half range, so
// overflow to +-inf is handled first.
fn round_f16(x: f32) -> f32 {
  if (x != x) { return x; }
  if (abs(x) >= 65520.0) { return select(-1.0, 1.0, x > 0.0) * bitcast<f32>(0x7f800000u); }
  return unpack2x16float(pack2x16float(vec2<f32>(x, 0.0))).x;
}

fn f_inf() -> f32 { return bitcast<f32>(0x7f800000u); }
fn f_nan() -> f32 { return bitcast<f32>(0x7fc00000u); }
fn is_nan(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }
fn is_inf(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) == 0x7f800000u; }

// erf: Abramowitz-Stegun 7.1.26 is too coarse (1e-7 abs only near 0); this uses the
// series for |x| < 2 and the continued-fraction-free complement above (max rel err ~1e-7).
fn erf_f32(x: f32) -> f32 {
  let a = abs(x);
  var r: f32;
  if (a < 2.0) {
    // Taylor series of erf around 0 in x^2, summed to convergence
    let x2 = a * a;
    var term = a;
    var sum = a;
    for (var k = 1; k < 40; k = k + 1) {
      term = -term * x2 / f32(k);
      let t = term / f32(2 * k + 1);
      sum = sum + t;
      if (abs(t) < 1e-9 * abs(sum)) { break; }
    }
    r = sum * 1.1283791670955126;
  } else if (a < 10.0) {
    // erfc(a) = exp(-a^2) / (a sqrt(pi)) * continued fraction (Lentz), accurate for a >= 2
    var f = a;
    var c = a;
    var d = 0.0;
    for (var k = 1; k < 60; k = k + 1) {
      let kk = f32(k) * 0.5;
      d = a + kk * d;
      d = 1.0 / d;
      c = a + kk / c;
      let delta = c * d;
      f = f * delta;
      if (abs(delta - 1.0) < 1e-7) { break; }
    }
    r = 1.0 - exp(-a * a) / f * 0.5641895835477563;
  } else {
    r = 1.0;
  }
  return select(r, -r, x < 0.0);
}

// Python-style integer floor division and modulo (numpy semantics; x // 0 = 0, x % 0 = 0).
fn floordiv_i32(a: i32, b: i32) -> i32 {
  if (b == 0) { return 0; }
  let q = a / b;
  return select(q, q - 1, (a % b != 0) && ((a < 0) != (b < 0)));
}
fn mod_i32(a: i32, b: i32) -> i32 {
  if (b == 0) { return 0; }
  let r = a % b;
  return select(r, r + b, (r != 0) && ((r < 0) != (b < 0)));
}
fn mod_f32(a: f32, b: f32) -> f32 {
  let r = a - b * floor(a / b);
  return select(r, r - b, (r != 0.0) && ((r < 0.0) != (b < 0.0)) && abs(r) >= abs(b));
}
fn pow_i32(a: i32, b: i32) -> i32 {
  if (b < 0) { return select(0, select(-1, 1, (b & 1) == 0), a == -1) + select(0, 1, a == 1); }
  var r = 1;
  var base = a;
  var e = b;
  loop {
    if (e == 0) { break; }
    if ((e & 1) != 0) { r = r * base; }
    base = base * base;
    e = e >> 1u;
  }
  return r;
}
// Round half to even, like numpy.round / Python round.
fn round_even(x: f32) -> f32 {
  let r = round(x);  // WGSL round() already rounds half to even
  return r;
}
fn tanh_f32(x: f32) -> f32 {
  // tanh() of some drivers returns NaN for |x| > ~88 (exp overflow); clamp first.
  let c = clamp(x, -20.0, 20.0);
  if (abs(c) < 0.0005) { return x; }
  return tanh(c);
}
fn sigmoid_f32(x: f32) -> f32 {
  let e = exp(-abs(x));
  let p = 1.0 / (1.0 + e);
  return select(1.0 - p, p, x >= 0.0);
}
fn expm1_f32(x: f32) -> f32 {
  if (abs(x) < 1e-3) { return x + 0.5 * x * x + x * x * x / 6.0; }
  return exp(x) - 1.0;
}
fn log1p_f32(x: f32) -> f32 {
  // log(1 + x) loses digits for small x; the (u - 1) correction restores them.
  let u = 1.0 + x;
  if (u == 1.0) { return x; }
  if (is_inf(u)) { return u; }
  return log(u) * x / (u - 1.0);
}
fn sign_f32(x: f32) -> f32 {
  if (x != x) { return x; }
  return select(select(0.0, -1.0, x < 0.0), 1.0, x > 0.0);
}
fn sign_i32(x: i32) -> i32 { return select(select(0, -1, x < 0), 1, x > 0); }
fn max_f32(a: f32, b: f32) -> f32 {
  if (is_nan(a) || is_nan(b)) { return f_nan(); }
  return max(a, b);
}
fn min_f32(a: f32, b: f32) -> f32 {
  if (is_nan(a) || is_nan(b)) { return f_nan(); }
  return min(a, b);
}
