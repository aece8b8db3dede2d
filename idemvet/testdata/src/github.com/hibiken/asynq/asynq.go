// Package asynq is a stub of github.com/hibiken/asynq.
package asynq

import (
	"context"
	"time"
)

type Task struct{}

func (t *Task) Payload() []byte { return nil }

type Option interface{}

func NewTask(typename string, payload []byte, opts ...Option) *Task { return &Task{} }
func TaskID(id string) Option                                       { return nil }
func Unique(ttl time.Duration) Option                               { return nil }
func GetTaskID(ctx context.Context) (string, bool)                  { return "", false }
