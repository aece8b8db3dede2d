// Package types is a stub of the SQS types package.
package types

type Message struct {
	MessageId     *string
	ReceiptHandle *string
	Body          *string
	Attributes    map[string]string
}

type SendMessageBatchRequestEntry struct {
	Id                     *string
	MessageBody            *string
	MessageGroupId         *string
	MessageDeduplicationId *string
}
