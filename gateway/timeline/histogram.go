package timeline

import (
	"math"
	"time"
)

// The latency histogram's scale (see the package doc): sub buckets per
// doubling, from histMin over histOctaves doublings.
const (
	histSub     = 8
	histOctaves = 24
	histMin     = 64 * time.Microsecond
	// histBuckets: one below histMin, histSub per doubling, one past the
	// top.
	histBuckets = histSub*histOctaves + 2
)

// histMax is the top of the scale: histMin·2^histOctaves (about 17.9 min).
const histMax = histMin << histOctaves

// gamma is each bucket's upper bound over its lower bound, 2^(1/histSub).
var gamma = math.Exp2(1.0 / histSub)

// MaxRelativeError bounds a percentile's error relative to the true value
// of the sample it stands for, within [64 µs, histMax): (γ-1)/(γ+1).
var MaxRelativeError = (gamma - 1) / (gamma + 1)

// histogram counts durations in fixed log-scale buckets.
type histogram [histBuckets]uint32

func histIndex(d time.Duration) int {
	switch {
	case d < histMin:
		return 0
	case d >= histMax:
		return histBuckets - 1
	}
	k := int(math.Floor(histSub * math.Log2(float64(d)/float64(histMin))))
	return min(max(k, 0), histSub*histOctaves-1) + 1
}

func (h *histogram) add(d time.Duration) { h[histIndex(d)]++ }

// quantile is the nearest-rank q-quantile (0 < q <= 1): the bucket of the
// ⌈q·n⌉-th smallest sample, at its representative value. Zero when empty.
func (h *histogram) quantile(q float64) time.Duration {
	var n uint64
	for _, c := range h {
		n += uint64(c)
	}
	if n == 0 {
		return 0
	}
	rank := max(uint64(math.Ceil(q*float64(n))), 1)
	var cum uint64
	for i, c := range h {
		cum += uint64(c)
		if cum >= rank {
			return histValue(i)
		}
	}
	return histMax
}

// histValue is bucket i's representative: 2γ/(γ+1) times its lower bound,
// which is within MaxRelativeError of every value in the bucket. The
// bucket below the scale reads histMin, the one past it histMax.
func histValue(i int) time.Duration {
	switch i {
	case 0:
		return histMin
	case histBuckets - 1:
		return histMax
	}
	lower := float64(histMin) * math.Exp2(float64(i-1)/histSub)
	return time.Duration(math.Round(lower * 2 * gamma / (gamma + 1)))
}
