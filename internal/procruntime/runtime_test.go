package procruntime_test

import (
	"testing"

	"github.com/switchyard-dev/switchyard/internal/procruntime"
)

func TestParseMemoryLimit(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
	}{
		{"1024", 1024}, {"64B", 64}, {"2KiB", 2 << 10}, {"512MiB", 512 << 20}, {"3GiB", 3 << 30}, {" 1 TiB ", 1 << 40},
	} {
		got, err := procruntime.ParseMemoryLimit(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseMemoryLimit(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "MiB", "-1MiB", "0", "1.5GiB", "12XB", "9999999999TiB"} {
		if got, err := procruntime.ParseMemoryLimit(bad); err == nil {
			t.Errorf("ParseMemoryLimit(%q) = %d, want an error", bad, got)
		}
	}
}
