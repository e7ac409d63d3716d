/*
emu_math.cpp: CUDA's fast-math intrinsics that glibc's math.h already declares (as internal
names) but libm does not export, so a kernel calling __expf() would not link. Here they are the
exact functions: the emulator trades the hardware's approximation error for none.
*/
#include <math.h>

extern "C" {
float __expf(float x) noexcept { return expf(x); }
float __logf(float x) noexcept { return logf(x); }
float __sinf(float x) noexcept { return sinf(x); }
float __cosf(float x) noexcept { return cosf(x); }
float __tanhf(float x) noexcept { return tanhf(x); }
float __powf(float x, float y) noexcept { return powf(x, y); }
}
