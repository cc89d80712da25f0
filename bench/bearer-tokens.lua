-- wrk script: GET the URL with a bearer token taken in turn from the file $BEARER_TOKENS (one a
-- line), so that a server's cache of verified tokens can be made to miss.
local tokens = {}
local next_token = 1

function init(args)
        for line in io.lines(os.getenv("BEARER_TOKENS")) do
                tokens[#tokens + 1] = line
        end
        -- each thread starts elsewhere in the list
        next_token = math.random(#tokens)
end

function request()
        local t = tokens[next_token]
        next_token = next_token % #tokens + 1
        return wrk.format("GET", nil, { ["Authorization"] = "Bearer " .. t })
end
