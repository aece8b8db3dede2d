// Package sqs is a stub of the SQS client package.
package sqs

import (
	"context"

	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

type Client struct{}

type SendMessageInput struct {
	QueueUrl               *string
	MessageBody            *string
	MessageGroupId         *string
	MessageDeduplicationId *string
}
type SendMessageOutput struct{ MessageId *string }

func (c *Client) SendMessage(ctx context.Context, in *SendMessageInput) (*SendMessageOutput, error) {
	return nil, nil
}

type ReceiveMessageOutput struct{ Messages []types.Message }
