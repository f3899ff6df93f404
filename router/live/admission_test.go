package live

import (
	"reflect"
	"testing"
)

// TestProtectionDefaultsIdempotent: filling the defaults twice gives what
// filling them once gives, so options defaulted by one layer can be handed
// to another (the Handler's admission, the simulator's).
func TestProtectionDefaultsIdempotent(t *testing.T) {
	for _, o := range []ProtectionOptions{{}, {NoSlotHeadroom: true}, {SlotHeadroom: 0.5}, {SlotHeadroom: -1}, {Routers: 3, MaxAttempts: 2}} {
		once := o.WithDefaults()
		if twice := once.WithDefaults(); !reflect.DeepEqual(once, twice) {
			t.Errorf("%+v: defaults once %+v, twice %+v", o, once, twice)
		}
	}
	if h := (ProtectionOptions{NoSlotHeadroom: true}).WithDefaults().SlotHeadroom; h != 0 {
		t.Errorf("NoSlotHeadroom: SlotHeadroom %v after defaults, want 0", h)
	}
}
