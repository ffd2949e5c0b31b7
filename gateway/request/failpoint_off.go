//go:build !failpoints

package request

// failpoint marks a crash-injection point. In normal builds it is nothing;
// built with -tags failpoints it can kill the process (failpoint_on.go).
func failpoint(string) {}
