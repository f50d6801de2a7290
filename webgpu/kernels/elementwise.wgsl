// Scalar helpers the generated elementwise kernels call (prepended to every fused kernel).
// Values live in their storage type: f32 for float32/float16, i32 for int32/int64, u32 for
// uint8/bool (0/1).

// float16 is stored as f32 on the GPU (Chromium has no shader-f16); every float16 result is
// rounded to half precision here. pack2x16float is undefined outside the half range, so
// overflow to +-inf is handled first.
fn round_f16(x: f32) -> f32 {
  if (x != x) { return x; }
  if (abs(x) >= 65520.0) { return select(-1.0, 1.0, x > 0.0) * f_inf(); }
  return unpack2x16float(pack2x16float(vec2<f32>(x, 0.0))).x;
}

// Chromium's shader compiler rejects an infinity or NaN in a constant expression, so their bit
// patterns live in private variables (not constants) and are converted at run time.
var<private> INF_BITS: u32 = 0x7f800000u;
var<private> NAN_BITS: u32 = 0x7fc00000u;
fn f_inf() -> f32 { return bitcast<f32>(INF_BITS); }
fn f_nan() -> f32 { return bitcast<f32>(NAN_BITS); }
fn is_nan(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }
fn is_inf(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) == 0x7f800000u; }

// erf without loops (it sits inside fused GELU kernels, which must stay memory-bound):
// |x| < 0.5: the Maclaurin series to x^13 (relative error < 1e-8); above: Abramowitz & Stegun
// 7.1.26, 1 - t exp(-x^2) P(t) with t = 1 / (1 + 0.3275911 x), absolute error < 1.5e-7, which is
// < 3e-7 relative there since erf(0.5) = 0.52.
fn erf_f32(x: f32) -> f32 {
  if (is_nan(x)) { return x; }
  let a = abs(x);
  var r: f32;
  if (a < 0.5) {
    let z = a * a;
    r = a * 1.1283791670955126 * (1.0 + z * (-0.3333333333333333 + z * (0.1 + z * (-0.023809523809523808
        + z * (0.004629629629629629 + z * (-0.0007575757575757576 + z * 0.00010683760683760684))))));
  } else if (a < 4.0) {
    let t = 1.0 / (1.0 + 0.3275911 * a);
    let p = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
    r = 1.0 - p * exp(-a * a);
  } else {
    r = 1.0;
  }
  return select(r, -r, x < 0.0);
}

// Python-style integer floor division and modulo (numpy semantics; x // 0 = 0, x % 0 = 0).
// The truncated remainder is a - (a / b) * b: WGSL's % on negative i32 operands gave wrong
// results on an NVIDIA Vulkan driver (-12 % 3 != 0), while / truncates reliably.
fn rem_i32(a: i32, b: i32) -> i32 { return a - (a / b) * b; }
fn floordiv_i32(a: i32, b: i32) -> i32 {
  if (b == 0) { return 0; }
  let q = a / b;
  return select(q, q - 1, (a - q * b != 0) && ((a < 0) != (b < 0)));
}
fn mod_i32(a: i32, b: i32) -> i32 {
  if (b == 0) { return 0; }
  let r = rem_i32(a, b);
  return select(r, r + b, (r != 0) && ((r < 0) != (b < 0)));
}
fn mod_f32(a: f32, b: f32) -> f32 {
  if (b == 0.0 || is_nan(a) || is_nan(b) || is_inf(a)) { return f_nan(); }
  if (is_inf(b)) {
    // Python: the sign of the divisor wins: 5 % inf = 5, -5 % inf = inf
    if (a == 0.0 || (a < 0.0) == (b < 0.0)) { return a; }
    return b;
  }
  var r = a - b * trunc(a / b);
  if (abs(r) >= abs(b)) { r = r - b * trunc(r / b); }
  if (r != 0.0 && ((r < 0.0) != (b < 0.0))) { r = r + b; }
  return r;
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
fn tanh_f32(x: f32) -> f32 {
  // tanh() of some drivers returns NaN for |x| > ~88 (exp overflow); clamp first.
  if (is_nan(x) || abs(x) < 0.0005) { return x; }
  return tanh(clamp(x, -20.0, 20.0));
}
fn sigmoid_f32(x: f32) -> f32 {
  let e = exp(-abs(x));
  let p = 1.0 / (1.0 + e);
  return select(e * p, p, x >= 0.0);
}
fn sign_f32(x: f32) -> f32 {
  if (is_nan(x)) { return x; }
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
// log/sqrt/sin/cos are undefined in WGSL outside their domain: spell out IEEE's answers.
fn log_f32(x: f32) -> f32 {
  if (is_nan(x) || x < 0.0) { return f_nan(); }
  if (x == 0.0) { return -f_inf(); }
  if (is_inf(x)) { return x; }
  return log(x);
}
fn sqrt_f32(x: f32) -> f32 {
  if (is_nan(x) || x < 0.0) { return f_nan(); }
  if (is_inf(x)) { return x; }
  return sqrt(x);
}
fn exp_f32(x: f32) -> f32 {
  if (is_nan(x)) { return x; }
  if (x > 88.72284) { return f_inf(); }
  if (x < -103.97) { return 0.0; }
  return exp(x);
}
fn sin_f32(x: f32) -> f32 {
  if (is_nan(x) || is_inf(x)) { return f_nan(); }
  return sin(x);
}
fn cos_f32(x: f32) -> f32 {
  if (is_nan(x) || is_inf(x)) { return f_nan(); }
  return cos(x);
}
fn div_f32(a: f32, b: f32) -> f32 {
  if (b == 0.0) {
    if (a == 0.0 || is_nan(a)) { return f_nan(); }
    // the sign of a zero divisor counts, as in IEEE division
    let neg = (a < 0.0) != ((bitcast<u32>(b) & 0x80000000u) != 0u);
    return select(f_inf(), -f_inf(), neg);
  }
  return a / b;
}
fn floordiv_f32(a: f32, b: f32) -> f32 {
  if (b == 0.0) { return div_f32(a, b); }
  if (is_nan(a) || is_nan(b) || is_inf(a)) { return f_nan(); }
  if (is_inf(b)) {
    // Python/numpy: 5 // inf = 0, -5 // inf = -1
    return select(-1.0, 0.0, a == 0.0 || (a < 0.0) == (b < 0.0));
  }
  return floor(a / b);
}
fn pow_f32(a: f32, b: f32) -> f32 {
  if (b == 0.0 || a == 1.0) { return 1.0; }
  if (is_nan(a) || is_nan(b)) { return f_nan(); }
  let bi = b == trunc(b) && abs(b) < 16777216.0;
  let odd = bi && (i32(abs(b)) & 1) == 1;
  if (a == 0.0) {
    if (b > 0.0) { return select(0.0, a, odd); }
    let s = select(1.0, -1.0, odd && (bitcast<u32>(a) & 0x80000000u) != 0u);
    return s * f_inf();
  }
  if (is_inf(b)) {
    let m = abs(a);
    if (m == 1.0) { return 1.0; }
    return select(0.0, f_inf(), (m > 1.0) == (b > 0.0));
  }
  if (a < 0.0) {
    if (!bi) { return f_nan(); }
    let r = pow_pos(-a, b);
    return select(r, -r, odd);
  }
  return pow_pos(a, b);
}
fn pow_pos(a: f32, b: f32) -> f32 {
  if (is_inf(a)) { return select(0.0, f_inf(), b > 0.0); }
  // small integer exponents by repeated squaring: exact where the product is
  if (b == trunc(b) && abs(b) <= 64.0) {
    var r = 1.0;
    var base = a;
    var e = u32(abs(b));
    loop {
      if (e == 0u) { break; }
      if ((e & 1u) != 0u) { r = r * base; }
      base = base * base;
      e = e >> 1u;
    }
    return select(r, 1.0 / r, b < 0.0);
  }
  return exp2(b * log2(a));
}
fn pow_u32(a: u32, b: u32) -> u32 {
  var r = 1u;
  var base = a;
  var e = b;
  loop {
    if (e == 0u) { break; }
    if ((e & 1u) != 0u) { r = r * base; }
    base = base * base;
    e = e >> 1u;
  }
  return r;
}
// float -> int casts: truncate toward zero, saturate, NaN -> 0 (ember's rule on every backend).
fn f32_to_i32(x: f32) -> i32 {
  if (is_nan(x)) { return 0; }
  if (x >= 2147483648.0) { return 2147483647; }
  if (x <= -2147483648.0) { return -2147483647 - 1; }
  return i32(trunc(x));
}
fn f32_to_u8(x: f32) -> u32 {
  if (is_nan(x)) { return 0u; }
  return u32(clamp(trunc(x), 0.0, 255.0));
}
fn ne_f32(a: f32, b: f32) -> bool { return is_nan(a) || is_nan(b) || a != b; }
fn gelu_f32(x: f32) -> f32 { return 0.5 * x * (1.0 + erf_f32(x * 0.7071067811865476)); }
fn gelu_tanh_f32(x: f32) -> f32 {
  let inner = (x + 0.044715 * x * x * x) * 0.7978845608028654;
  return 0.5 * x * (1.0 + tanh_f32(inner));
}
