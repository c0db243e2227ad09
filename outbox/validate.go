package outbox

import "fmt"

// ValidateForAppend checks the fields a Store needs to accept a row:
// a non-empty DispatchKey, Namespace and TaskQueue. It returns an error
// wrapping ErrInvalidRow that names the row index and field, or nil.
// Stores call it for every row before writing anything, so one bad row
// leaves the whole batch unwritten.
func ValidateForAppend(i int, r *Row) error {
	switch {
	case r.DispatchKey == "":
		return fmt.Errorf("%w: rows[%d].dispatch_key is empty", ErrInvalidRow, i)
	case r.Namespace == "":
		return fmt.Errorf("%w: rows[%d].namespace is empty (key %q)", ErrInvalidRow, i, r.DispatchKey)
	case r.TaskQueue == "":
		return fmt.Errorf("%w: rows[%d].task_queue is empty (key %q)", ErrInvalidRow, i, r.DispatchKey)
	}
	return nil
}
