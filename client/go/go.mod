module patd.dev/pat

go 1.19
