package main

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// dropRedisPrefix deletes every key of the run's prefix, so a run of a few
// hundred thousand 4 KiB records does not sit in a shared Redis for the
// idempotency TTL. It returns how many keys went.
func dropRedisPrefix(ctx context.Context, url, prefix string) (int, error) {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return 0, err
	}
	c := redis.NewClient(opt)
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	n := 0
	it := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	batch := make([]string, 0, 1000)
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := c.Unlink(ctx, batch...).Err()
		n += len(batch)
		batch = batch[:0]
		return err
	}
	for it.Next(ctx) {
		if batch = append(batch, it.Val()); len(batch) == cap(batch) {
			if err := flush(); err != nil {
				return n, err
			}
		}
	}
	if err := it.Err(); err != nil {
		return n, fmt.Errorf("scan %s*: %w", prefix, err)
	}
	return n, flush()
}
