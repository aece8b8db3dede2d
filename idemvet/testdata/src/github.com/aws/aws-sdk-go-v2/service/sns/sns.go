// Package sns is a stub of the SNS client package.
package sns

type PublishInput struct {
	Message                *string
	MessageGroupId         *string
	MessageDeduplicationId *string
}
