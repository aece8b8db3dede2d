module example.com/vetmod

go 1.24
