package sim

import (
	"hash/fnv"
	"strconv"
)

// plan draws every random decision of a run — the workload, the provider's
// behaviour and the store's faults — from the seed and the decision's name
// (what, which key, its how-many-th time), never from a shared stream of
// random numbers. So a seed gives the same workload and the same fault for
// the same call of the same key, whatever order the goroutines run in.
type plan struct{ seed int64 }

// roll is a number in [0, 1) for the named decision.
func (p plan) roll(what, key string, n int) float64 {
	return float64(p.bits(what, key, n)>>11) / (1 << 53)
}

// intn is a number in [0, max) for the named decision.
func (p plan) intn(what, key string, n, max int) int {
	if max <= 0 {
		return 0
	}
	return int(p.bits(what, key, n) % uint64(max))
}

func (p plan) bits(what, key string, n int) uint64 {
	h := fnv.New64a()
	h.Write([]byte(strconv.FormatInt(p.seed, 10)))
	h.Write([]byte{0})
	h.Write([]byte(what))
	h.Write([]byte{0})
	h.Write([]byte(key))
	h.Write([]byte{0})
	h.Write([]byte(strconv.Itoa(n)))
	return splitmix(h.Sum64())
}

// splitmix spreads fnv's bits (it is weak in the low ones).
func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// choose picks one of names by the weights, for the named decision.
func (p plan) choose(what, key string, n int, names []string, weights []float64) string {
	total := 0.0
	for _, w := range weights {
		total += w
	}
	r := p.roll(what, key, n) * total
	for i, w := range weights {
		if r < w {
			return names[i]
		}
		r -= w
	}
	return names[len(names)-1]
}
