// Package events is a stub of aws-lambda-go's events package.
package events

type SQSEvent struct{ Records []SQSMessage }

type SQSMessage struct {
	MessageId     string
	ReceiptHandle string
	Body          string
}

type SQSEventResponse struct {
	BatchItemFailures []SQSBatchItemFailure
}

type SQSBatchItemFailure struct{ ItemIdentifier string }

type APIGatewayProxyRequest struct {
	Body    string
	Headers map[string]string
}

type APIGatewayProxyResponse struct {
	StatusCode int
	Body       string
}
