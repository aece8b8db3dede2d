// Package logrus is a stub of github.com/sirupsen/logrus.
package logrus

func Errorf(format string, args ...any) {}
