//go:build amd64

package nn

import "golang.org/x/sys/cpu"

// siluMulF32 computes out[i] = float32(silu(float64(g[i])))·u[i] four elements at a time
// with the bits of silu (kernels_act_amd64.s), over the first n4 groups of four, stopping
// before a group that holds an element with |g| > 708 or NaN (silu's exp takes special
// paths there); it returns the number of groups done.
//
//go:noescape
func siluMulF32(n4 int, gate, up, out *float32) (done int)

// hasExpKernels: the kernels's exp follows math.Exp's FMA path, which math takes with AVX
// and FMA; the kernel itself needs AVX2.
var hasExpKernels = cpu.X86.HasAVX2 && cpu.X86.HasFMA

// swigluF32 is swiglu's loop over one chunk for float32, through the kernel where it can.
func swigluF32(g, u, out []float32) {
	n := len(g)
	u, out = u[:n], out[:n]
	i := 0
	if hasExpKernels {
		for i+4 <= n {
			i += 4 * siluMulF32((n-i)/4, &g[i], &u[i], &out[i])
			if i+4 <= n { // a group with an element the kernel leaves to Go
				swigluGo(g[i:i+4], u[i:i+4], out[i:i+4])
				i += 4
			}
		}
	}
	swigluGo(g[i:], u[i:], out[i:])
}

// expF64 sets x[i] = exp(x[i]) with math.Exp's bits over the first n4 groups of four
// (kernels_act_amd64.s), stopping before a group that holds an element with |x| > 708 or
// NaN; it returns the number of groups done.
//
//go:noescape
func expF64(n4 int, x *float64) (done int)

// expInPlace sets x[i] = math.Exp(x[i]), through the kernel where it can.
func expInPlace(x []float64) {
	n, i := len(x), 0
	if hasExpKernels {
		for i+4 <= n {
			i += 4 * expF64((n-i)/4, &x[i])
			if i+4 <= n {
				expGo(x[i : i+4])
				i += 4
			}
		}
	}
	expGo(x[i:])
}

// siluBwdF32 is swigluBwd's loop four elements at a time with its bits
// (kernels_act_amd64.s), over the first n4 groups, stopping before a group that holds an
// element with |g| > 708 or NaN; it returns the number of groups done.
//
//go:noescape
func siluBwdF32(n4 int, gate, up, dout, dgate, dup *float32) (done int)

// swigluBwdF32 is swigluBwd's loop over one chunk for float32, through the kernel where
// it can.
func swigluBwdF32(g, u, dout, dg, du []float32) {
	n := len(g)
	u, dout, dg, du = u[:n], dout[:n], dg[:n], du[:n]
	i := 0
	if hasExpKernels {
		for i+4 <= n {
			i += 4 * siluBwdF32((n-i)/4, &g[i], &u[i], &dout[i], &dg[i], &du[i])
			if i+4 <= n {
				swigluBwdGo(g[i:i+4], u[i:i+4], dout[i:i+4], dg[i:i+4], du[i:i+4])
				i += 4
			}
		}
	}
	swigluBwdGo(g[i:], u[i:], dout[i:], dg[i:], du[i:])
}

// expAffineF32 sets out[i] = exp(float64(x[i])·scale − shift) with math.Exp's bits over
// the first n4 groups of four (kernels_act_amd64.s), stopping before a group with an
// argument of magnitude over 708 or NaN; it returns the number of groups done.
//
//go:noescape
func expAffineF32(n4 int, x *float32, scale, shift float64, out *float64) (done int)

// expAffine sets out[i] = math.Exp(float64(x[i])*scale - shift), through the kernel where
// it can.
func expAffine[T Float](x []T, scale, shift float64, out []float64) {
	n, i := len(x), 0
	out = out[:n]
	if xf, ok := any(x).([]float32); ok && hasExpKernels {
		for i+4 <= n {
			i += 4 * expAffineF32((n-i)/4, &xf[i], scale, shift, &out[i])
			if i+4 <= n {
				expAffineGo(x[i:i+4], scale, shift, out[i:i+4])
				i += 4
			}
		}
	}
	expAffineGo(x[i:], scale, shift, out[i:])
}
